#!/usr/bin/python3
"""export_torch.py: a PyTorch module as a pipedream model JSON plus its weights.

    /usr/bin/python3 tools/export_torch.py FILE.py:FACTORY --input-shape C,H,W -o MODEL.json \\
        --weights INIT.safetensors [--name NAME] [--seed S]

FACTORY() (a function or class in FILE.py; FILE.py may `import torch_models`) returns an
nn.Module taking one batch-first input of the given per-sample shape (token ids for language
models: --input-shape 64). The module is traced with torch.fx (the transformer and recurrent
modules of tools/torch_models.py are kept whole) and every node is mapped to pipedream layers:

    nn.Conv2d (square kernel/stride/padding, dilation 1, groups 1)        conv2d
    nn.BatchNorm2d / BatchNorm1d (affine, running statistics)             batchnorm
    nn.ReLU, F.relu, torch.relu, .relu()   (fused into conv/linear/bn)    relu
    nn.MaxPool2d, F.max_pool2d (no padding, dilation 1)                   maxpool
    nn.AdaptiveAvgPool2d(1), F.adaptive_avg_pool2d(x, 1)                  gap
    nn.Dropout, F.dropout                                                 dropout
    nn.Flatten, torch.flatten(x, 1), .flatten(1), .view/.reshape          flatten / reshape
    nn.Linear on a vector / on a sequence                                 linear / dense
    nn.ZeroPad2d (equal sides)                                            pad
    nn.Embedding, torch_models.Embed                                      embed
    nn.Embedding(x) + nn.Embedding(arange(T)) (nanoGPT's wte + wpe)       embed with positions
    nn.LayerNorm (last dimension)                                         layernorm
    nn.GELU, F.gelu (approximate 'none' or 'tanh')                        gelu
    torch_models.CausalSelfAttention                                      attention
    nanoGPT's CausalSelfAttention (c_attn: Linear(d, 3d), c_proj, n_head;
      its dropouts 0 or unused in eval)                                   attention (causal)
    nn.MultiheadAttention(d, h, batch_first=True)(x, x, x, attn_mask=M,
      need_weights=False)[0], M causal (bool triu(1) or -inf above the
      diagonal) or absent                                                 attention
    nn.LSTM (1 layer, batch_first) + [0], torch_models.Lstm               lstm
    x[:, -1, :]                                                           last_step
    a fork joined by + then relu                                          residual (body, shortcut)
    x + f(x) (no relu)                                                    block step; consecutive
                                                                          steps of one module form
                                                                          one "block"
    nn.Identity, nn.Sequential                                            (transparent)

A parameter shared by two modules (nanoGPT's `wte.weight = lm_head.weight`) is exported once as
the earlier layer's and, at the later one, as "tie": "<its pipedream name>" (the weights file
holds the tied copy under both names, as pipedream's own files do). Only a top-level layer's weight
can be tied so.

Anything else is an error naming the module (or node) and the op. The weights file holds the
module's parameters (and batch-norm running statistics) under pipedream's global names
(tools/pd_io.py), so `pipedream train MODEL.json --init INIT.safetensors` and `pipedream eval`
start from exactly PyTorch's weights. As a library: export(module, input_shape, name) returns
(model_json_dict, parameter tensors, state arrays) in pipedream's order (tools/gen_ref.py uses
it for the round-trip references of tests/test_nn_export.c)."""
import argparse
import importlib.util
import json
import operator
import os
import sys

os.environ.setdefault('OMP_NUM_THREADS', '1')
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.fx as fx  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.fx.passes.shape_prop import ShapeProp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pd_io  # noqa: E402
import torch_models as tm  # noqa: E402

LEAVES = (tm.Embed, tm.CausalSelfAttention, tm.Lstm)


def is_nanogpt_attention(m):
    """nanoGPT's hand-written CausalSelfAttention: c_attn Linear(d, 3d), c_proj Linear(d, d), n_head
    heads, a causal mask; q, k, v = c_attn(x).split(d, dim=2), each (B, T, n_head, d / n_head)."""
    a, p = getattr(m, 'c_attn', None), getattr(m, 'c_proj', None)
    return isinstance(a, nn.Linear) and isinstance(p, nn.Linear) and hasattr(m, 'n_head') and \
        a.out_features == 3 * a.in_features and p.in_features == p.out_features == a.in_features


class ExportError(Exception):
    pass


class Tracer(fx.Tracer):
    """Keeps the modules of LEAVES whole and records, for every node, the stack of modules it
    was created in (node.meta['stack']: qualified names, outermost first)."""

    def __init__(self):
        super().__init__()
        self.stack = []

    def trace(self, root, concrete_args=None):
        """torch.arange(0, T) with T from x.size() (nanoGPT's positions) is recorded as a node:
        torch.fx of torch 1.13 would pass the Proxy to arange itself."""
        arange = torch.arange

        def traced_arange(*a, **k):
            if any(isinstance(v, fx.Proxy) for v in list(a) + list(k.values())):
                return self.create_proxy('call_function', arange, a, k)
            return arange(*a, **k)
        torch.arange = traced_arange
        try:
            return super().trace(root, concrete_args)
        finally:
            torch.arange = arange

    def is_leaf_module(self, m, qn):
        return isinstance(m, LEAVES) or is_nanogpt_attention(m) or super().is_leaf_module(m, qn)

    def call_module(self, m, forward, args, kwargs):
        self.stack.append(self.path_of_module(m))
        try:
            return super().call_module(m, forward, args, kwargs)
        finally:
            self.stack.pop()

    def create_node(self, *a, **k):
        n = super().create_node(*a, **k)
        n.meta['stack'] = list(self.stack)
        return n


def _pair(v, what, mod):
    if isinstance(v, (tuple, list)):
        if len(set(v)) != 1:
            raise ExportError('%s: %s %s is not square (pipedream needs equal sizes)' % (mod, what, tuple(v)))
        return int(v[0])
    return int(v)


def _np(t):
    return t.detach().cpu().numpy().astype(np.float32)


def _t(t):
    return t   # layers keep the module's own tensors (export() returns them; main() converts)


class Exporter:
    def __init__(self, module, input_shape, name):
        self.root, self.input_shape, self.name = module, tuple(input_shape), name
        self.graph = Tracer().trace(module)
        self.gm = fx.GraphModule(module, self.graph)
        self.mods = dict(module.named_modules())
        self.token_input = len(input_shape) == 1 and self._first_is_embedding()
        x = torch.zeros((2,) + self.input_shape, dtype=torch.long if self.token_input else torch.float32)
        was = module.training
        self.gm.eval()
        ShapeProp(self.gm).propagate(x)
        self.gm.train(was)
        adds = {}
        for n in self.graph.nodes:   # adds per innermost module: a module holding one add is a "step"
            if self._is_add(n) and n.meta['stack']:
                adds[n.meta['stack'][-1]] = adds.get(n.meta['stack'][-1], 0) + 1
        self.adds_in = adds

    # ---- helpers ----------------------------------------------------------------------------
    def _first_is_embedding(self):
        for n in self.graph.nodes:
            if n.op == 'call_module':
                return isinstance(self.mods[n.target], (nn.Embedding, tm.Embed))
        return False

    def where(self, n):
        if n.op == 'call_module':
            return "module '%s' (%s)" % (n.target, type(self.mods[n.target]).__name__)
        owner = n.meta.get('stack') or []
        return "node '%s' (%s %s)%s" % (n.name, n.op, getattr(n.target, '__name__', n.target),
                                       " in module '%s'" % owner[-1] if owner else '')

    def shape(self, n):
        """Per-sample output shape of node n."""
        tm_ = n.meta.get('tensor_meta')
        if tm_ is None or not hasattr(tm_, 'shape'):
            raise ExportError('%s: no tensor shape (not a tensor op?)' % self.where(n))
        return tuple(tm_.shape[1:])

    @staticmethod
    def _is_meta(n):
        """Nodes that only compute shapes (x.size(0), x.shape, x.dim())."""
        return (n.op == 'call_method' and n.target in ('size', 'dim')) or \
            (n.op == 'call_function' and n.target is getattr and n.args[1] in ('shape', 'ndim', 'device', 'dtype'))

    def users(self, n):
        out = []
        for u in n.users:
            if self._is_meta(u):
                continue
            out.append(u)
        return out

    @staticmethod
    def _is_add(n):
        return (n.op == 'call_function' and n.target in (operator.add, torch.add, operator.iadd)) or \
            (n.op == 'call_method' and n.target in ('add', 'add_'))

    def _is_relu(self, n):
        if n.op == 'call_module':
            return isinstance(self.mods[n.target], nn.ReLU)
        return (n.op == 'call_function' and n.target in (torch.relu, F.relu)) or \
            (n.op == 'call_method' and n.target in ('relu', 'relu_'))

    # ---- one node -> one layer ------------------------------------------------------------------
    def map_node(self, n):
        """Returns a layer dict (keys starting with '_' are ours), or None for an identity op."""
        if n.op == 'call_module':
            return self.map_module(n, self.mods[n.target])
        if self._is_relu(n):
            return {'type': 'relu'}
        t, a = n.target, n.args
        if n.op == 'call_function' and t is operator.getitem:
            src = a[0]
            if src.op == 'call_module' and isinstance(self.mods[src.target], (nn.LSTM, nn.MultiheadAttention)) and \
                    a[1] == 0:
                return None   # the output sequence of nn.LSTM, the attention output of nn.MultiheadAttention
            idx = a[1]
            if isinstance(idx, tuple) and len(idx) == 3 and idx[0] == slice(None) and idx[1] == -1 and \
                    idx[2] == slice(None):
                return {'type': 'last_step'}
            raise ExportError('%s: indexing %r is not supported (only x[:, -1, :])' % (self.where(n), idx))
        if (n.op == 'call_function' and t is torch.flatten) or (n.op == 'call_method' and t == 'flatten'):
            start = a[1] if len(a) > 1 else n.kwargs.get('start_dim', 0)
            if start != 1 or (len(a) > 2 and a[2] != -1):
                raise ExportError('%s: flatten must keep the batch dimension (start_dim=1)' % self.where(n))
            return {'type': 'flatten'}
        if n.op == 'call_method' and t in ('view', 'reshape'):
            s = self.shape(n)
            return {'type': 'flatten'} if len(s) == 1 else {'type': 'reshape', 'shape': list(s)}
        if n.op == 'call_function' and t is F.dropout:
            p = float(n.kwargs.get('p', a[1] if len(a) > 1 else 0.5))
            return {'type': 'dropout', 'p': p} if p else None
        if n.op == 'call_function' and t is F.gelu:
            return {'type': 'gelu', 'approximate': n.kwargs.get('approximate', 'none')}
        if n.op == 'call_function' and t is F.max_pool2d:
            k = _pair(a[1] if len(a) > 1 else n.kwargs['kernel_size'], 'kernel', self.where(n))
            s = n.kwargs.get('stride', a[2] if len(a) > 2 else None)
            if n.kwargs.get('padding', 0) or n.kwargs.get('dilation', 1) != 1 or n.kwargs.get('ceil_mode'):
                raise ExportError('%s: max pool with padding, dilation or ceil_mode is not supported' % self.where(n))
            return {'type': 'maxpool', 'kernel': k, 'stride': _pair(s, 'stride', self.where(n)) if s else k}
        if n.op == 'call_function' and t is F.adaptive_avg_pool2d:
            if _pair(a[1], 'output size', self.where(n)) != 1:
                raise ExportError('%s: only adaptive average pooling to 1x1 is supported' % self.where(n))
            return {'type': 'gap'}
        raise ExportError('%s: op not supported by pipedream (see tools/export_torch.py for what maps)' %
                          self.where(n))

    def map_module(self, n, m):
        w = self.where(n)
        insh = self.shape(n.args[0])
        if isinstance(m, nn.Identity):
            return None
        if isinstance(m, nn.Conv2d):
            if m.groups != 1 or _pair(m.dilation, 'dilation', w) != 1 or m.padding_mode != 'zeros' or \
                    isinstance(m.padding, str):
                raise ExportError('%s: groups, dilation, padding modes other than zeros are not supported' % w)
            L = {'type': 'conv2d', 'in': m.in_channels, 'out': m.out_channels,
                 'kernel': _pair(m.kernel_size, 'kernel', w)}
            st, pd = _pair(m.stride, 'stride', w), _pair(m.padding, 'padding', w)
            if st != 1:
                L['stride'] = st
            if pd:
                L['pad'] = pd
            if m.bias is None:
                L['bias'] = False
            L['_params'] = [_t(m.weight)] + ([_t(m.bias)] if m.bias is not None else [])
            return L
        if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
            if not m.affine or not m.track_running_stats or m.momentum is None:
                raise ExportError('%s: batch norm needs affine=True, track_running_stats=True and a momentum' % w)
            L = {'type': 'batchnorm', 'features': m.num_features}
            if m.eps != 1e-5:
                L['eps'] = m.eps
            if m.momentum != 0.1:
                L['momentum'] = m.momentum
            L['_params'] = [_t(m.weight), _t(m.bias)]
            L['_state'] = [_t(m.running_mean), _t(m.running_var)]
            return L
        if isinstance(m, nn.ReLU):
            return {'type': 'relu'}
        if isinstance(m, nn.MaxPool2d):
            if _pair(m.padding, 'padding', w) or _pair(m.dilation, 'dilation', w) != 1 or m.ceil_mode or \
                    m.return_indices:
                raise ExportError('%s: max pool with padding, dilation, ceil_mode or indices is not supported' % w)
            k = _pair(m.kernel_size, 'kernel', w)
            s = _pair(m.stride, 'stride', w) if m.stride is not None else k
            return {'type': 'maxpool', 'kernel': k, 'stride': s}
        if isinstance(m, nn.AdaptiveAvgPool2d):
            if _pair(m.output_size, 'output size', w) != 1:
                raise ExportError('%s: only adaptive average pooling to 1x1 is supported' % w)
            return {'type': 'gap'}
        if isinstance(m, nn.Dropout):
            return {'type': 'dropout', 'p': float(m.p)} if m.p else None   # p = 0: the identity
        if isinstance(m, nn.Flatten):
            if m.start_dim != 1 or m.end_dim != -1:
                raise ExportError('%s: flatten must be Flatten(1, -1)' % w)
            return {'type': 'flatten'}
        if isinstance(m, nn.Linear):
            L = {'type': 'linear' if len(insh) == 1 else 'dense', 'in': m.in_features, 'out': m.out_features}
            if m.bias is None:
                L['bias'] = False
            L['_params'] = [_t(m.weight)] + ([_t(m.bias)] if m.bias is not None else [])
            return L
        if isinstance(m, nn.ZeroPad2d):
            p = tuple(m.padding)
            if len(set(p)) != 1:
                raise ExportError('%s: padding %s is not equal on all sides' % (w, p))
            return {'type': 'pad', 'pad': int(p[0])}
        if isinstance(m, nn.Embedding):
            if m.padding_idx is not None or m.max_norm is not None:
                raise ExportError('%s: padding_idx and max_norm are not supported' % w)
            return {'type': 'embed', 'vocab': m.num_embeddings, 'dim': m.embedding_dim, '_params': [_t(m.weight)]}
        if isinstance(m, tm.Embed):
            L = {'type': 'embed', 'vocab': m.tok.num_embeddings, 'dim': m.tok.embedding_dim,
                 '_params': [_t(m.tok.weight)]}
            if m.pos is not None:
                if m.pos.num_embeddings != insh[0]:
                    raise ExportError('%s: %d positions for sequences of %d' % (w, m.pos.num_embeddings, insh[0]))
                L['positions'] = insh[0]
                L['_params'].append(_t(m.pos.weight))
            return L
        if isinstance(m, nn.LayerNorm):
            if len(m.normalized_shape) != 1 or not m.elementwise_affine:
                raise ExportError('%s: layer norm over more than the last dimension or without affine' % w)
            L = {'type': 'layernorm', 'features': m.normalized_shape[0]}
            if m.eps != 1e-5:
                L['eps'] = m.eps
            L['_params'] = [_t(m.weight), _t(m.bias)]
            return L
        if isinstance(m, nn.GELU):
            return {'type': 'gelu', 'approximate': m.approximate}
        if isinstance(m, tm.CausalSelfAttention):
            bias = m.qkv.bias is not None
            L = {'type': 'attention', 'dim': m.qkv.in_features, 'heads': m.heads, 'causal': bool(m.causal)}
            if not bias:
                L['bias'] = False
            L['_params'] = [_t(m.qkv.weight)] + ([_t(m.qkv.bias)] if bias else []) + [_t(m.proj.weight)] + \
                ([_t(m.proj.bias)] if bias else [])
            return L
        if is_nanogpt_attention(m):
            for k in ('attn_dropout', 'resid_dropout'):
                d = getattr(m, k, None)
                if isinstance(d, nn.Dropout) and d.p and m.training:
                    raise ExportError('%s: %s p=%g (pipedream\'s attention has no dropout; export with p=0 or '
                                      'in eval mode)' % (w, k, d.p))
            d, bias = m.c_attn.in_features, m.c_attn.bias is not None
            if (m.c_proj.bias is not None) != bias:
                raise ExportError('%s: c_attn and c_proj must both have biases or neither' % w)
            if d % int(m.n_head):
                raise ExportError('%s: %d heads do not divide width %d' % (w, m.n_head, d))
            L = {'type': 'attention', 'dim': d, 'heads': int(m.n_head), 'causal': True}
            if not bias:
                L['bias'] = False
            L['_params'] = [_t(m.c_attn.weight)] + ([_t(m.c_attn.bias)] if bias else []) + [_t(m.c_proj.weight)] + \
                ([_t(m.c_proj.bias)] if bias else [])
            return L
        if isinstance(m, nn.MultiheadAttention):
            return self.map_mha(n, m, insh, w)
        if isinstance(m, (nn.LSTM, tm.Lstm)):
            lstm = m.lstm if isinstance(m, tm.Lstm) else m
            if lstm.num_layers != 1 or lstm.bidirectional or not lstm.batch_first or not lstm.bias or \
                    getattr(lstm, 'proj_size', 0):
                raise ExportError('%s: only 1-layer, unidirectional, batch_first LSTMs with biases' % w)
            if len(n.args) > 1:
                raise ExportError('%s: an initial state (h0, c0) is not supported' % w)
            return {'type': 'lstm', 'in': lstm.input_size, 'hidden': lstm.hidden_size,
                    '_params': [_t(lstm.weight_ih_l0), _t(lstm.weight_hh_l0), _t(lstm.bias_ih_l0),
                                _t(lstm.bias_hh_l0)]}
        raise ExportError('%s: module not supported by pipedream (see tools/export_torch.py for what maps)' % w)

    def map_mha(self, n, m, insh, w):
        """nn.MultiheadAttention as self-attention: one input three times, batch_first, packed
        in-projection (q, k, v rows: pipedream's qkv), biases, no dropout; the mask causal or none."""
        if not m.batch_first or not m._qkv_same_embed_dim or m.in_proj_bias is None or m.bias_k is not None or \
                m.add_zero_attn or (m.dropout and m.training):
            raise ExportError('%s: only batch_first self-attention with biases, no bias_k/v, no zero attention and '
                              'no dropout' % w)
        args = list(n.args) + [n.kwargs.get(k) for k in ('query', 'key', 'value') if k in n.kwargs]
        if len(args) < 3 or not (args[0] is args[1] is args[2]):
            raise ExportError('%s: query, key and value must be the same tensor (self-attention)' % w)
        kw = dict(n.kwargs)
        for k, v in zip(('key_padding_mask', 'need_weights', 'attn_mask'), n.args[3:]):
            kw[k] = v
        if kw.get('key_padding_mask') is not None:
            raise ExportError('%s: key_padding_mask is not supported' % w)
        if kw.get('need_weights', True):
            raise ExportError('%s: call it with need_weights=False (pipedream returns no attention weights)' % w)
        for u in n.users:
            if not (u.op == 'call_function' and u.target is operator.getitem and u.args[1] == 0):
                raise ExportError('%s: only its output [0] may be used' % w)
        mask, causal = kw.get('attn_mask'), False
        if mask is not None:
            t = insh[0]
            mv = self._const(mask, w)
            if tuple(mv.shape) != (t, t):
                raise ExportError('%s: attn_mask of shape %s, expected (%d, %d)' % (w, tuple(mv.shape), t, t))
            upper = torch.ones(t, t, dtype=torch.bool).triu(1)
            if mv.dtype == torch.bool:
                ok = torch.equal(mv, upper)
            else:
                ok = bool(torch.isneginf(mv[upper]).all()) and bool((mv[~upper] == 0).all())
            if not ok:
                raise ExportError('%s: attn_mask is not the causal mask (True or -inf above the diagonal)' % w)
            causal = True
        d = m.embed_dim
        L = {'type': 'attention', 'dim': d, 'heads': m.num_heads, 'causal': causal,
             '_params': [_t(m.in_proj_weight), _t(m.in_proj_bias), _t(m.out_proj.weight), _t(m.out_proj.bias)]}
        if m.out_proj.bias is None:
            raise ExportError('%s: out_proj without bias is not supported' % w)
        return L

    def _const(self, n, w):
        """The value of a node computed from constants and module attributes only (a mask)."""
        env, todo, order = {}, [n], []
        while todo:
            x = todo.pop()
            if x in env or x in order:
                continue
            if x.op == 'placeholder':
                raise ExportError('%s: attn_mask depends on the input; only a constant mask is supported' % w)
            order.append(x)
            todo += list(x.all_input_nodes)
        pos = {x: i for i, x in enumerate(self.graph.nodes)}
        for x in sorted(order, key=lambda q: pos[q]):
            args = fx.node.map_arg(x.args, lambda q: env[q])
            kwargs = fx.node.map_arg(x.kwargs, lambda q: env[q])
            if x.op == 'get_attr':
                v = self.root
                for part in x.target.split('.'):
                    v = getattr(v, part)
            elif x.op == 'call_function':
                v = x.target(*args, **kwargs)
            elif x.op == 'call_method':
                v = getattr(args[0], x.target)(*args[1:], **kwargs)
            elif x.op == 'call_module':
                v = self.mods[x.target](*args, **kwargs)
            else:
                raise ExportError('%s: attn_mask from %s is not supported' % (w, x.op))
            env[x] = v
        return env[n].detach()

    def _pos_embedding(self, layers, add):
        """nanoGPT's tok_emb + pos_emb: add joins the embed just appended (token ids, no positions
        yet) and nn.Embedding(torch.arange(T)); returns that embedding module, else None."""
        if not layers or layers[-1]['type'] != 'embed' or 'positions' in layers[-1] or len(add.args) != 2:
            return None
        for o in add.args:
            if isinstance(o, fx.Node) and o.op == 'call_module' and isinstance(self.mods[o.target], nn.Embedding) \
                    and o.args and isinstance(o.args[0], fx.Node):
                src = o.args[0]
                if src.op == 'call_function' and src.target is torch.arange:
                    return o, self.mods[o.target]
        return None

    # ---- chains, forks and joins ----------------------------------------------------------------
    def reach(self, n):
        seen, todo = set(), [n]
        while todo:
            x = todo.pop()
            for u in self.users(x):
                if u not in seen:
                    seen.add(u)
                    todo.append(u)
        return seen

    def chain(self, cur, stop):
        """Layers from value node cur (exclusive) up to stop (exclusive; None = the output).
        Returns (layers, last value node)."""
        layers = []
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        while True:
            us = self.users(cur)
            if any(u.op == 'output' for u in us):
                if len(us) != 1:
                    raise ExportError('%s: used by the output and by other ops' % self.where(cur))
                return layers, cur
            if len(us) == 1:
                u = us[0]
                if u is stop:
                    return layers, cur
                if self._is_add(u):
                    pe = self._pos_embedding(layers, u)
                    if pe is None:
                        raise ExportError('%s: an add that does not join a fork of one input' % self.where(u))
                    node, emb = pe
                    t = self.shape(u)[0]
                    ar = node.args[0]
                    rng = [a for a in ar.args if not isinstance(a, fx.Node)]
                    if emb.embedding_dim != layers[-1]['dim'] or emb.padding_idx is not None or \
                            emb.max_norm is not None or emb.num_embeddings < t:
                        raise ExportError('%s: a position embedding of %d x %d for %d positions of width %d' %
                                          (self.where(node), emb.num_embeddings, emb.embedding_dim, t,
                                           layers[-1]['dim']))
                    if rng and rng[0] != 0 and len(ar.args) > 1:
                        raise ExportError('%s: positions must be arange(0, T)' % self.where(ar))
                    layers[-1]['positions'] = t
                    layers[-1]['_params'].append(_t(emb.weight[:t]) if emb.num_embeddings > t else _t(emb.weight))
                    cur = u
                    continue
                L = self.map_node(u)
                if L is not None:
                    self.append(layers, L, u)
                cur = u
                continue
            if len(us) != 2:
                raise ExportError('%s: its output feeds %d ops; only forks into two branches joined by an add are '
                                  'supported' % (self.where(cur), len(us)))
            common = self.reach(us[0]) | {us[0]}
            common &= self.reach(us[1]) | {us[1]}
            join = min(common, key=lambda x: order[x]) if common else None
            if join is None or not self._is_add(join):
                raise ExportError('%s: a fork whose branches do not meet in an add (%s)' %
                                  (self.where(cur), self.where(join) if join is not None else 'never'))
            branches = []
            for u in us:
                if u is join:
                    branches.append(([], cur))
                    continue
                L = self.map_node(u)
                bl = []
                if L is not None:
                    self.append(bl, L, u)
                sub, last = self.chain(u, join)
                for s in sub:
                    bl.append(s)
                branches.append((bl, last))
            if set(join.args[:2]) != {b[1] for b in branches} or len(join.args) != 2:
                raise ExportError('%s: the add does not take exactly the two branches' % self.where(join))
            branches.sort(key=lambda b: -len(b[0]))   # the longer branch is the body
            (body, _), (short, _) = branches
            if not body:
                raise ExportError('%s: x + x is not supported' % self.where(join))
            after = self.users(join)
            if len(after) == 1 and self._is_relu(after[0]):
                L = {'type': 'residual', 'body': body}
                if short:
                    L['shortcut'] = short
                layers.append(L)
                cur = after[0]
                continue
            if short:
                raise ExportError('%s: an add of two non-identity branches must be followed by a relu (pipedream\'s '
                                  'residual)' % self.where(join))
            stack = join.meta.get('stack') or []
            owner = tuple(stack[:-1]) if stack and self.adds_in.get(stack[-1]) == 1 else tuple(stack)
            prev = layers[-1] if layers else None
            if prev is not None and prev['type'] == 'block' and owner and prev['_owner'] == owner:
                prev['steps'].append(body)
            else:
                layers.append({'type': 'block', 'steps': [body], '_owner': owner})
            cur = join

    @staticmethod
    def append(layers, L, node):
        """Appends L, fusing a relu into a preceding conv2d / linear / batchnorm."""
        if L['type'] == 'relu' and layers and layers[-1]['type'] in ('conv2d', 'linear', 'batchnorm') and \
                not layers[-1].get('relu'):
            layers[-1]['relu'] = True
            return
        layers.append(L)

    def run(self):
        inputs = [n for n in self.graph.nodes if n.op == 'placeholder']
        if len(inputs) != 1:
            raise ExportError('the module takes %d inputs; pipedream models take one' % len(inputs))
        layers, last = self.chain(inputs[0], None)
        if not layers:
            raise ExportError('the module computes nothing pipedream can run')
        model = {'name': self.name, 'input': list(self.input_shape), 'layers': layers}
        params, states = [], []

        def collect(L):
            out, st = list(L.get('_params', [])), list(L.get('_state', []))
            subs = L.get('body', []) + L.get('shortcut', []) if L['type'] == 'residual' else \
                [s for step in L['steps'] for s in step] if L['type'] == 'block' else []
            for s in subs:
                o2, s2 = collect(s)
                out += o2
                st += s2
            return out, st

        for L in layers:
            p, s = collect(L)
            params += p
            if s:
                states.append(np.concatenate([_np(a).reshape(-1) for a in s]))
        self.tie(layers, params)
        return strip(model), params, states

    def tie(self, layers, params):
        """A tensor met a second time (a parameter shared by two modules) becomes the later top-level
        layer's "tie" to the first occurrence's pipedream name."""
        names = [nm for nm, _ in pd_io.param_names(strip({'layers': layers}))]
        first, k = {}, 0
        for i, L in enumerate(layers):
            n_own = len(pd_io._layer_params(strip(L), 'layers.%d' % i))
            for j in range(n_own):
                p = params[k + j]
                if id(p) in first:
                    if j != 0 or not names[k].endswith('.weight') or names[k] != 'layers.%d.weight' % i:
                        raise ExportError('%s is shared with %s; only a top-level layer\'s weight can be tied' %
                                          (names[k + j], first[id(p)]))
                    L['tie'] = first[id(p)]
                else:
                    first[id(p)] = names[k + j]
            k += n_own


def strip(o):
    if isinstance(o, dict):
        return {k: strip(v) for k, v in o.items() if not k.startswith('_')}
    if isinstance(o, list):
        return [strip(v) for v in o]
    return o


def export(module, input_shape, name='model'):
    """(model JSON dict, the module's parameter tensors in pipedream's order, state arrays (one
    concatenated float32 array per top-level layer with state))."""
    return Exporter(module, input_shape, name).run()


def dumps(model):
    """JSON text with one top-level layer per line."""
    head = {k: v for k, v in model.items() if k != 'layers'}
    s = json.dumps(head)[:-1] + ', "layers": [\n'
    s += ',\n'.join('    ' + json.dumps(L) for L in model['layers'])
    return s + '\n]}\n'


def load_factory(spec):
    path, _, fn = spec.rpartition(':')
    if not path or not fn:
        raise ExportError('expected FILE.py:FACTORY, got "%s"' % spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    s = importlib.util.spec_from_file_location('pd_export_src', path)
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    if not hasattr(mod, fn):
        raise ExportError('%s has no "%s"' % (path, fn))
    return getattr(mod, fn)


def load_idx_test(d):
    """An IDX set's test split as pipedream reads and standardises it (pd_io.Images: with the
    mean and std of the set's training split, as pipedream computes them): x (N, 1, H, W)
    float32, labels int64."""
    try:
        im = pd_io.Images(d)
    except FileNotFoundError as e:
        raise ExportError('no %s' % e)
    if not im.std > 0:
        raise ExportError('%s: the training images have one value: cannot standardise them' % d)
    return im.x_test, im.y_test


def torch_eval(module, x, y, batch=256):
    """Eval-mode mean cross-entropy and accuracy of module on (x, y)."""
    module.eval()
    tot, hits = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out = module(torch.from_numpy(x[i:i + batch]))
            t = torch.from_numpy(y[i:i + batch])
            tot += F.cross_entropy(out.double(), t, reduction='sum').item()
            hits += (out.argmax(1) == t).sum().item()
    return tot / len(x), hits / len(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('factory', help='FILE.py:FACTORY')
    ap.add_argument('--input-shape', required=True, help='per-sample input shape, e.g. 1,28,28 or 64 (tokens)')
    ap.add_argument('-o', '--output', required=True, help='model JSON to write')
    ap.add_argument('--weights', required=True, help='safetensors weights file to write')
    ap.add_argument('--name', help='model name (default: FACTORY)')
    ap.add_argument('--seed', type=int, default=0, help='torch.manual_seed before calling FACTORY (default 0)')
    ap.add_argument('--eval-idx', metavar='DIR', help='also print PyTorch\'s test loss and accuracy of the exported '
                    'weights on this IDX dataset\'s test split, standardised as pipedream does (JSON on stdout)')
    a = ap.parse_args()
    torch.set_num_threads(1)
    try:
        shape = tuple(int(v) for v in a.input_shape.split(','))
        fn = load_factory(a.factory)
        torch.manual_seed(a.seed)
        module = fn()
        name = a.name or a.factory.rpartition(':')[2]
        model, params, states = export(module, shape, name)
        with open(a.output, 'w') as f:
            f.write(dumps(model))
        pd_io.write_weights(a.weights, model, [_np(p) for p in params], states)
    except (ExportError, ValueError) as e:
        print('export_torch: error: %s' % e, file=sys.stderr)
        return 1
    if a.eval_idx:
        x, y = load_idx_test(a.eval_idx)
        loss, acc = torch_eval(module, x, y)
        print(json.dumps({'framework': 'pytorch', 'model': name, 'test_loss': loss, 'test_accuracy': acc,
                          'samples': len(x)}))
    n = sum(p.numel() for p in {id(p): p for p in params}.values())
    print('export_torch: %s: %d top-level layers, %d parameters -> %s, %s' %
          (name, len(model['layers']), n, a.output, a.weights), file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
