/* sim_wire.c: what a wire codec costs a message in the simulator (sim.h, SimOpts.wire_at): its
 * encoded bytes (kern_codec_bytes, int8 rows taken as 64 values) and the seconds a core spends
 * encoding and decoding it. The seconds are constants per value, measured once with the
 * codecs' AVX-512 code on one core of the development machine (1 Mi values, the median of
 * repeats): int8 0.65 ns to encode, 0.3 ns to decode; int4 1.15 ns (2.3 ns with the stochastic
 * rounding of gradients) and 0.3 ns; delta 5.2 ns (reference read, difference, int4,
 * reconstruction, reference kept) and 1.3 ns; error feedback adds 2.7 ns to an encoding. bf16 and
 * fp32 cost no time here, as before the codecs (bf16's packing is in the profile's times as
 * little as fp32's copy). */
#include "kernels.h"
#include "sim.h"

_Static_assert(KCODEC_FP32 == 0 && KCODEC_BF16 == 1 && KCODEC_INT8 == 2 && KCODEC_INT4 == 3 &&
                   (int)KCODEC_COUNT == (int)SIM_WIRE_DELTA,
               "the simulator numbers codecs as the kernels do, delta next");

double sim_wire_bytes(int wire, double fp32_bytes) {
    if (wire <= 0 || wire >= SIM_WIRE_COUNT || fp32_bytes <= 0) return fp32_bytes;
    KCodec kc = {.codec = wire == SIM_WIRE_DELTA ? KCODEC_INT4 : wire, .block = 64};
    return (double)kern_codec_bytes(&kc, (size_t)(fp32_bytes / 4));
}

double sim_wire_codec_s(int wire, int grad, int error_feedback, int enc, double fp32_bytes) {
    static const double ns[SIM_WIRE_COUNT][2] = {{0, 0}, {0, 0}, {0.3, 0.65}, {0.3, 1.15}, {1.3, 5.2}};
    if (wire <= KCODEC_BF16 || wire >= SIM_WIRE_COUNT || fp32_bytes <= 0) return 0;
    double per = ns[wire][enc];
    if (enc && grad && wire == KCODEC_INT4) per = 2.3;
    if (enc && grad && error_feedback) per += 2.7;
    return per * 1e-9 * fp32_bytes / 4;
}

int sim_wire_auto(const Schedule *s, const SimCosts *c, const Cluster *cl, unsigned allow, int error_feedback, int *wire,
                  Err *err) {
    double slowest = 0;
    for (int i = 0; i < s->n_stages; i++) {
        double t = (c->stage[i].fwd_s + c->stage[i].bwd_s) / (s->stages[i].replicas > 0 ? s->stages[i].replicas : 1);
        if (t > slowest) slowest = t;
    }
    for (int b = 0; b + 1 < s->n_stages; b++) {
        const SchedStage *lo = &s->stages[b], *hi = &s->stages[b + 1];
        const double raw = c->stage[b + 1].in_bytes;
        const int pairs = lo->replicas < hi->replicas ? lo->replicas : hi->replicas;
        const double bw = cl && cl->n_levels > 0 ? cluster_link_bandwidth(cl, lo->ranks[0], hi->ranks[0]) : 0;
        for (int g = 0; g < 2; g++) {
            int pick = -1, fewest = -1;
            for (int k = 0; k < SIM_WIRE_COUNT && pick < 0; k++) {
                if (!(allow & 1u << k) || (g && k == SIM_WIRE_DELTA)) continue;
                double bytes = sim_wire_bytes(k, raw);
                if (fewest < 0 || bytes < sim_wire_bytes(fewest, raw)) fewest = k;
                /* the codec's time joins the two stages' compute */
                double codec = sim_wire_codec_s(k, g, error_feedback, 1, raw) + sim_wire_codec_s(k, g, error_feedback, 0, raw);
                double link = bw > 0 ? bytes / bw / (pairs > 0 ? pairs : 1) : 0;
                if (link <= slowest + codec) pick = k;
            }
            if (fewest < 0)
                return err_set(err, PD_EINVAL, "--wire-allow names no codec for the %s", g ? "gradients" : "activations");
            wire[2 * b + g] = pick >= 0 ? pick : fewest;
        }
    }
    return PD_OK;
}
