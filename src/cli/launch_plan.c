/* launch_plan.c: the hosts and their plans: the hostfile, the plan for a set of hosts under the
 * job's schedule (on the cluster as launch knows it), link probes, re-planning around
 * stragglers, and taking in hosts listed anew. */
#define _DEFAULT_SOURCE
#include "launch_impl.h"
#include "comm.h"
#include "choose.h"
#include "search.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Reads an Open MPI hostfile: the first word of each line, '#' to the end of a line ignored,
 * duplicates once. Returns the count or -1 (message printed). */
int launch_hosts_read(const char *path, LaunchHost *out, int max) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "pipedream: error: cannot read the hostfile %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char word[256];
        if (sscanf(line, " %255s", word) != 1) continue;
        int dup = 0;
        for (int i = 0; i < n; i++) dup |= !strcmp(out[i].name, word);
        if (dup) continue;
        if (n == max) {
            fclose(f);
            fprintf(stderr, "pipedream: error: %s: more than %d hosts\n", path, max);
            return -1;
        }
        snprintf(out[n++].name, sizeof out[0].name, "%s", word);
    }
    fclose(f);
    return n;
}

int launch_hosts_write(const char *path, const LaunchHost *h, int n) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    for (int i = 0; i < n; i++) fprintf(f, "%s slots=1\n", h[i].name);
    return fclose(f);
}

/* Is name among hosts[0..n)? */
int launch_host_in(const char *name, const LaunchHost *hosts, int n) {
    for (int j = 0; j < n; j++)
        if (!strcmp(name, hosts[j].name)) return 1;
    return 0;
}

int launch_ts_after(struct timespec a, struct timespec b) {
    return a.tv_sec > b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec > b.tv_nsec);
}

/* What launch has learnt about host name (NULL: nothing). */
static LaunchKnown *known_of(Launch *L, const char *name, int add) {
    for (int i = 0; i < L->learned.n_known; i++)
        if (!strcmp(L->learned.known[i].name, name)) return &L->learned.known[i];
    if (!add || L->learned.n_known >= MAX_HOSTS) return NULL;
    LaunchKnown *k = &L->learned.known[L->learned.n_known++];
    snprintf(k->name, sizeof k->name, "%s", name);
    k->speed = k->bandwidth = 0;
    return k;
}

/* The cluster of these hosts: n workers at --bandwidth, and, when launch knows some of them to
 * be slower (a compute straggler's speed, a slow link's rate), a heterogeneous cluster that
 * says so (worker r = hosts[r]). */
static void cluster_for(Launch *L, const LaunchHost *hosts, int n, Cluster *cl) {
    memset(cl, 0, sizeof *cl);
    cl->n_levels = 1;
    cl->level[0].workers = n;
    cl->level[0].bandwidth = L->cfg.bandwidth;
    for (int r = 0; r < n && n <= PD_MAX_HOSTS; r++) {
        const LaunchKnown *k = known_of(L, hosts[r].name, 0);
        if (!k) continue;
        cl->n_hosts = n;
        cl->host[r].speed = k->speed;
        cl->host[r].bandwidth = k->bandwidth;
    }
}

/* What checkpoints cost per minibatch on cl: every --checkpoint-every minibatches rank 0 gathers
 * each stage's parameters and optimizer state (1 + opt_state_factor times the parameters) from
 * the stage's first replica, over that rank's link and rank 0's. A slow link under a stage with
 * large weights can cost more here than in training. */
static double ckpt_cost(const Launch *L, const Plan *p, const Profile *prof, const Cluster *cl) {
    double t = 0;
    for (int s = 0; s < p->n_stages; s++) {
        int r = p->stages[s].ranks[0];
        if (r == 0) continue;
        double bytes = 0;
        for (int i = 0; i < p->stages[s].n_layers; i++) bytes += prof->layers[p->stages[s].layers[i]].param_bytes;
        t += bytes * (1 + L->cfg.opt_state_factor) / cluster_link_bandwidth(cl, r, 0);
    }
    return t / L->cfg.ckpt_every;
}

/* The job's micro-batches per minibatch on n workers: train's --microbatches, or its default. */
static int job_micro(const Launch *L, int n) {
    if (L->cfg.micro > 0) return L->cfg.micro;
    if (L->cfg.vsync) return 1;
    return sched_default_micro_for(L->cfg.kind, n, L->cfg.minibatch > 0 ? L->cfg.minibatch : CLI_TRAIN_MINIBATCH);
}

/* The time per minibatch of p on cl: the simulator's under the job's schedule, plus the
 * checkpoints' share (1e300: none). */
static double plan_score(const Launch *L, const Plan *p, const Profile *prof, const Cluster *cl) {
    SearchCand sc;
    Err err = {0};
    if (!p || plan_search_score(p, prof, cl, L->cfg.kind, job_micro(L, p->n_workers), L->cfg.recompute, L->cfg.opt_state_factor, &sc,
                                &err))
        return 1e300;
    return sc.minibatch_s + ckpt_cost(L, p, prof, cl);
}

/* The plan for these hosts, for the job's schedule, micro-batches, chunks and wire format. A
 * homogeneous cluster under 1f1b with one unit per minibatch, or an interleaved job: the
 * partitioner's (plan_new, as `pipedream plan PROFILE --workers n --bandwidth B [--chunks V]
 * [--wire bf16]`). Another schedule, or some host known slower: the candidates of `pipedream
 * plan` scored by the simulator under the job's schedule, on every placement of their stages
 * (plan_choose), so that a slow link carries the smallest activations and a slow host the
 * least work. */
Plan *launch_plan_for(Launch *L, const Profile *prof, const LaunchHost *hosts, int n, Err *err) {
    Cluster cl;
    cluster_for(L, hosts, n, &cl);
    PlanOpts o;
    memset(&o, 0, sizeof o);
    o.cost_model = COST_OURS;
    o.straight = L->cfg.straight;
    o.chunks = L->cfg.chunks;
    o.activation_compression = L->cfg.wire_bf16 ? 2 : 0;   /* train --wire bf16: half the bytes on every link */
    int simple = L->cfg.kind == SCHED_1F1B && job_micro(L, n) == 1;   /* the partitioner's own model is 1f1b's */
    if ((!cluster_heterogeneous(&cl) && simple) || L->cfg.chunks > 1) {   /* (the candidates have no interleaved plans) */
        Plan *p = plan_new(prof, &cl, &o, err);
        double t = p && cluster_heterogeneous(&cl) ? plan_score(L, p, prof, &cl) : 1e300;
        if (t < 1e300) p->pipeline_s = t;
        return p;
    }
    ChooseOpts co = {.kind = L->cfg.kind, .n_micro = job_micro(L, n), .opt_state_factor = L->cfg.opt_state_factor, .plan = o};
    ChooseResult r;
    if (plan_choose(prof, prof, &cl, &co, &r, err)) return NULL;
    Plan *p = r.c[r.chosen].plan;
    r.c[r.chosen].plan = NULL;   /* ours now */
    if (r.c[r.chosen].score.minibatch_s < 1e300) p->pipeline_s = r.c[r.chosen].score.minibatch_s;
    plan_choose_release(&r);
    return p;
}

/* `pipedream launch --link-probe BYTES` under mpirun -np 2: rank 0 sends BYTES to rank 1 and
 * gets them back (after a 64 KiB exchange that opens the connection), and prints the rate of
 * the timed exchange in bytes/s: 2 BYTES / its time. */
int launch_link_probe_main(const char *bytes_arg) {
    double b = atof(bytes_arg);
    if (!(b >= 1 && b <= 1e9)) return cli_usage_error("launch", "--link-probe: bytes from 1 to 1e9 (got %s)", bytes_arg);
    size_t n = (size_t)b, warm = 65536;
    Comm *c = NULL;
    Err err = {0};
    if (comm_mpi_create(NULL, NULL, &c, &err)) return cli_fail(&err);
    int rc = CLI_FAIL;
    char *buf = calloc(n > warm ? n : warm, 1);
    if (!buf || comm_size(c) != 2) {
        fprintf(stderr, "pipedream: error: launch --link-probe runs on 2 ranks\n");
    } else if (comm_rank(c) == 0) {
        double t0 = 0;
        if (!comm_ctrl_send(c, 1, 0, buf, warm, 60, &err) && !comm_ctrl_recv(c, 1, 0, buf, warm, NULL, 60, &err) &&
            (t0 = launch_now(), !comm_ctrl_send(c, 1, 0, buf, n, 120, &err)) && !comm_ctrl_recv(c, 1, 0, buf, n, NULL, 120, &err)) {
            printf("%.6g\n", 2.0 * (double)n / (launch_now() - t0));
            rc = CLI_OK;
        }
    } else {
        if (!comm_ctrl_recv(c, 0, 0, buf, warm, NULL, 60, &err) && !comm_ctrl_send(c, 0, 0, buf, warm, 60, &err) &&
            !comm_ctrl_recv(c, 0, 0, buf, n, NULL, 120, &err) && !comm_ctrl_send(c, 0, 0, buf, n, 120, &err))
            rc = CLI_OK;
    }
    if (rc != CLI_OK && err.msg[0]) fprintf(stderr, "pipedream: error: launch --link-probe: %s\n", err.msg);
    free(buf);
    fflush(stdout);
    comm_free(c);
    return rc;
}

/* The rate between hosts a and b (bytes/s, both ways: their slower link's), by running the
 * probe above on them; 0 when it fails or takes longer than --probe-timeout. */
static double probe_link(const Launch *L, const LaunchHost *a, const LaunchHost *b) {
    char hosts[520], bytes[32], out[PATH_MAX + 32];
    snprintf(hosts, sizeof hosts, "%s,%s", a->name, b->name);
    snprintf(bytes, sizeof bytes, "%.0f", L->cfg.probe_bytes);
    snprintf(out, sizeof out, "%s/link-probe.out", L->cfg.run_dir);
    char *extra[] = {"--host", hosts, "-np", "2", (char *)L->cfg.exe, "launch", "--link-probe", bytes, NULL};
    char *buf, **argv = launch_mpirun_argv(L, &buf, extra);
    int status, done = launch_run_quietly(argv, out, L->cfg.probe_timeout, &status);
    free(argv), free(buf);
    double rate = 0;
    FILE *f = fopen(out, "r");
    if (f) {
        if (fscanf(f, "%lf", &rate) != 1) rate = 0;
        fclose(f);
    }
    unlink(out);
    return done == 1 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && rate > 0 ? rate : 0;
}

/* Each host's link: probes host r with r + 1 around the ring (r with the other host when there
 * are two); a link is at least as fast as the faster of its two probes. A host whose estimate
 * is under --bandwidth / --straggler-factor, and under the fastest host's by that factor, is a
 * straggler: reported, and known to the planner at the rate measured. Returns how many. */
static int probe_links(Launch *L, const LaunchHost *hosts, int n) {
    double pair[MAX_HOSTS] = {0}, est[MAX_HOSTS] = {0}, best = 0;
    if (n < 2) return 0;
    int m = n == 2 ? 1 : n;
    for (int r = 0; r < m && !launch_stop; r++) pair[r] = probe_link(L, &hosts[r], &hosts[(r + 1) % n]);
    for (int r = 0; r < n; r++) {
        double left = pair[(r + m - 1) % m], right = pair[r % m];
        est[r] = left > right ? left : right;
        if (est[r] > best) best = est[r];
    }
    fprintf(stderr, "pipedream: launch: links (MB/s, %.3g MB each way):", L->cfg.probe_bytes / 1e6);
    for (int r = 0; r < n; r++) fprintf(stderr, " %s %.3g", hosts[r].name, est[r] / 1e6);
    fputc('\n', stderr);
    int slow = 0;
    for (int r = 0; r < n && n > 2; r++) {
        if (!(est[r] > 0) || est[r] * L->cfg.straggler_factor >= L->cfg.bandwidth || est[r] * L->cfg.straggler_factor >= best) continue;
        LaunchKnown *k = known_of(L, hosts[r].name, 1);
        if (!k) continue;
        k->bandwidth = est[r];
        slow++;
        fprintf(stderr, "pipedream: launch: straggler: %s (rank %d): its link moves %.3g MB/s, under 1/%g of both "
                "--bandwidth (%.3g MB/s) and the fastest host's (%.3g MB/s)\n", hosts[r].name, r, est[r] / 1e6,
                L->cfg.straggler_factor, L->cfg.bandwidth / 1e6, best / 1e6);
        FILE *e = launch_event_begin(L, "straggler");
        if (e) {
            fputs(",\"host\":", e);
            launch_json_str(e, hosts[r].name);
            fprintf(e, ",\"rank\":%d,\"link_bytes_per_s\":%.6g,\"bandwidth\":%.6g", r, est[r], L->cfg.bandwidth);
        }
        launch_event_end(e);
        launch_note_straggler(L, hosts[r].name);
    }
    return slow;
}

/* Same stages, layers and ranks. */
static int same_plan(const Plan *a, const Plan *b) {
    if (!plan_same_partition(a, b)) return 0;
    for (int st = 0; st < a->n_stages; st++)
        for (int i = 0; i < a->stages[st].replicas; i++)
            if (a->stages[st].ranks[i] != b->stages[st].ranks[i]) return 0;
    return 1;
}

/* A straggler was reported or the pipeline runs slower than predicted (launch_straggler_check): probe
 * the links if asked, learn the compute stragglers' speeds (each host's compute over prediction
 * against the median host's), and with re-planning on, plan for every host as it is now known
 * and for the hosts without each straggler; when the best of those is another plan, predicted
 * at least 10% faster than the current plan on the cluster as now known, and the time it saves
 * over the minibatches left exceeds a restart's, it becomes g->next (the job ends at the next
 * checkpoint) and 1. */
int launch_replan_check(Launch *L, LaunchGrow *g, long remaining) {
    L->watch.replan_wanted = 0;
    int n = g->n_hosts;
    if (L->watch.probe_wanted) {
        L->watch.probe_wanted = 0;
        probe_links(L, g->hosts, n);
    }
    double measured[MAX_HOSTS] = {0};
    int k = 0;
    for (int r = 0; r < n; r++)
        if (L->watch.ratio[r] > 0) measured[k++] = L->watch.ratio[r];
    double median = launch_median(measured, k);
    for (int r = 0; r < n && median > 0; r++)
        if (L->watch.reported[r] && L->watch.ratio[r] > 0) {
            LaunchKnown *kn = known_of(L, g->hosts[r].name, 1);
            if (kn) kn->speed = median / L->watch.ratio[r] < 1 ? median / L->watch.ratio[r] : 1;
        }
    if (!L->cfg.replan) return 0;
    Cluster cl;
    cluster_for(L, g->hosts, n, &cl);
    if (!cluster_heterogeneous(&cl)) return 0;
    double t_now = plan_score(L, g->plan, g->prof, &cl), best = t_now;
    Plan *choice = NULL;
    Err err = {0};
    /* every host, placed by what is known of them */
    Plan *p = launch_plan_for(L, g->prof, g->hosts, n, &err);
    double tp = p ? plan_score(L, p, g->prof, &cl) : 1e300;
    if (p && tp < best) {
        best = tp, choice = p;
        g->n_next = n;
        memcpy(g->next_hosts, g->hosts, sizeof(LaunchHost) * (size_t)n);
        snprintf(g->why, sizeof g->why, "the stages placed around the slower hosts");
    } else {
        plan_free(p);
    }
    /* without each straggler */
    for (int s = 0; s < n && n - 1 >= L->cfg.min_hosts; s++) {
        const LaunchKnown *kn = known_of(L, g->hosts[s].name, 0);
        if (!kn || (!(kn->speed > 0 && kn->speed < 1) && !(kn->bandwidth > 0))) continue;
        LaunchHost rest[MAX_HOSTS];
        int m = 0;
        for (int r = 0; r < n; r++)
            if (r != s) rest[m++] = g->hosts[r];
        Err e2 = {0};
        Plan *q = launch_plan_for(L, g->prof, rest, m, &e2);
        Cluster cq;
        cluster_for(L, rest, m, &cq);
        double t = q ? plan_score(L, q, g->prof, &cq) : 1e300;
        if (q && t < best) {
            plan_free(choice);
            best = t, choice = q;
            g->n_next = m;
            memcpy(g->next_hosts, rest, sizeof(LaunchHost) * (size_t)m);
            snprintf(g->why, sizeof g->why, "without the straggler %s", g->hosts[s].name);
        } else {
            plan_free(q);
        }
    }
    if (choice && g->n_next == n && same_plan(choice, g->plan)) plan_free(choice), choice = NULL;
    if (!choice || !(best < 0.9 * t_now)) {
        fprintf(stderr, "pipedream: launch: no plan predicted 10%% faster than the current one (%.4g s per minibatch on "
                "the hosts as now known): not re-planning\n", t_now);
        plan_free(choice);
        return 0;
    }
    /* a restart costs about what the last one took; the saving must be larger */
    double saving = (t_now - best) * (double)remaining;
    if (saving < L->learned.restart_s) {
        fprintf(stderr, "pipedream: launch: a new plan (%s) would save a predicted %.3g s over the %ld minibatches left, "
                "less than a restart (about %.3g s): not re-planning\n", g->why, saving, remaining, L->learned.restart_s);
        plan_free(choice);
        return 0;
    }
    g->replan = 1;
    g->next = choice;
    g->t_now = t_now, g->t_next = best;
    return 1;
}

/* When the hostfile changed since the last look: its hosts not in g->hosts (a dropped one only
 * if the file changed after it was dropped) that answer a probe; if the planner predicts a
 * faster minibatch with them, g->add and g->next (the caller's) and 1. */
int launch_grow_check(Launch *L, LaunchGrow *g) {
    struct stat st;
    if (!g || stat(L->cfg.hostfile, &st) || !launch_ts_after(st.st_mtim, L->learned.hf_seen)) return 0;
    L->learned.hf_seen = st.st_mtim;
    LaunchHost listed[MAX_HOSTS];
    int n_listed = launch_hosts_read(L->cfg.hostfile, listed, MAX_HOSTS);
    g->n_add = 0;
    for (int i = 0; i < n_listed && g->n_hosts + g->n_add < MAX_HOSTS; i++) {
        int skip = 0;
        for (int j = 0; j < g->n_hosts; j++) skip |= !strcmp(listed[i].name, g->hosts[j].name);
        for (int j = 0; j < L->learned.n_dropped; j++)
            skip |= !strcmp(listed[i].name, L->learned.dropped[j].name) && !launch_ts_after(st.st_mtim, L->learned.dropped_at[j]);
        if (skip) continue;
        if (launch_probe_host(L, &listed[i]) == 1) g->add[g->n_add++] = listed[i];
        else fprintf(stderr, "pipedream: launch: %s is listed but does not answer: not taken in\n", listed[i].name);
    }
    if (!g->n_add) return 0;
    Err err = {0};
    LaunchHost all[MAX_HOSTS];
    memcpy(all, g->hosts, sizeof(LaunchHost) * (size_t)g->n_hosts);
    memcpy(all + g->n_hosts, g->add, sizeof(LaunchHost) * (size_t)g->n_add);
    g->next = launch_plan_for(L, g->prof, all, g->n_hosts + g->n_add, &err);
    if (g->next && g->next->pipeline_s < g->plan->pipeline_s) return 1;
    if (g->next)
        fprintf(stderr, "pipedream: launch: %d more host%s would not be faster (predicted %.4g s per minibatch, now %.4g): not taken in\n",
                g->n_add, g->n_add == 1 ? "" : "s", g->next->pipeline_s, g->plan->pipeline_s);
    else
        fprintf(stderr, "pipedream: launch: no plan for %d hosts: %s\n", g->n_hosts + g->n_add, err.msg);
    plan_free(g->next);
    g->next = NULL;
    g->n_add = 0;
    return 0;
}
