/* launch_proc.c: launch's child processes: the signals that stop launch, mpirun's argv, starting
 * a program in a process group of its own with its stderr in a pipe (and nothing else of
 * ours), ending it and what it left behind, and the short runs that probe a host. */
#define _DEFAULT_SOURCE   /* usleep, setpgid */
#include "launch_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

double launch_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

volatile sig_atomic_t launch_stop;
volatile pid_t launch_child;

static void on_signal(int sig) {
    launch_stop = sig;
    if (launch_child > 0) kill(launch_child, SIGTERM);
}

/* argv of mpirun: the binary, --mpirun-args split at spaces, then extra (NULL-terminated),
 * whatever their lengths. The caller frees *buf (the strings of --mpirun-args) and the array. */
char **launch_mpirun_argv(const Launch *L, char **buf, char *const *extra) {
    size_t n_extra = 0, max = 2;
    while (extra[n_extra]) n_extra++;
    *buf = strdup(L->cfg.mpirun_args ? L->cfg.mpirun_args : "");
    PD_ASSERT(*buf);
    for (const char *c = *buf; *c; c++) max += *c == ' ' || *c == '\t' || *c == '\n';
    max += strlen(*buf) / 2 + 1 + n_extra;
    char **argv = malloc(max * sizeof *argv);
    PD_ASSERT(argv);
    size_t n = 0;
    argv[n++] = (char *)L->cfg.mpirun;
    for (char *save = NULL, *t = strtok_r(*buf, " \t\n", &save); t; t = strtok_r(NULL, " \t\n", &save)) argv[n++] = t;
    for (size_t i = 0; i < n_extra; i++) argv[n++] = extra[i];
    PD_ASSERT(n < max);
    argv[n] = NULL;
    return argv;
}

/* pipe(2) with both ends closed on exec. */
static int cloexec_pipe(int p[2]) {
    if (pipe(p)) return -1;
    fcntl(p[0], F_SETFD, FD_CLOEXEC);
    fcntl(p[1], F_SETFD, FD_CLOEXEC);
    return 0;
}

/* Forks argv in a process group of its own with stdin from in_path and stdout to out_path
 * (NULL: /dev/null) and stderr into a pipe (*err_fd). Returns its pid, or -1 with errno set
 * when it could not start (no pipe, no fork, or exec failed: the program is missing or cannot
 * run); nothing is left open then. The child inherits no descriptor of ours but the three. */
pid_t launch_spawn(char **argv, const char *in_path, const char *out_path, int *err_fd) {
    int p[2], x[2];   /* p: its stderr; x: closed on a successful exec, else the errno of exec */
    if (cloexec_pipe(p)) return -1;
    if (cloexec_pipe(x)) {
        int e = errno;
        close(p[0]), close(p[1]);
        errno = e;
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]), close(p[1]), close(x[0]), close(x[1]);
        errno = e;
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);   /* its own group: a signal to the launcher's group does not reach it twice */
        signal(SIGPIPE, SIG_DFL);   /* launch ignores it; exec would keep that */
        int o = open(out_path ? out_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (o >= 0) dup2(o, 1);
        dup2(p[1], 2);
        int in = open(in_path ? in_path : "/dev/null", O_RDONLY | O_CLOEXEC);
        if (in >= 0) dup2(in, 0);
        execvp(argv[0], argv);
        int e = errno;
        ssize_t w = write(x[1], &e, sizeof e);
        (void)w;
        _exit(127);
    }
    close(p[1]);
    close(x[1]);
    int e = 0;
    ssize_t got;
    while ((got = read(x[0], &e, sizeof e)) < 0 && errno == EINTR) {}
    close(x[0]);
    if (got == (ssize_t)sizeof e) {   /* exec failed */
        close(p[0]);
        waitpid(pid, NULL, 0);
        errno = e;
        return -1;
    }
    *err_fd = p[0];
    return pid;
}

static void kill_wait(pid_t pid, int *status) {
    kill(pid, SIGTERM);
    for (int i = 0; i < 50; i++) {
        if (waitpid(pid, status, WNOHANG) == pid) return;
        usleep(100000);
    }
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    waitpid(pid, status, 0);
}

/* Ends what is left of process group pgid (its leader has ended): SIGTERM, then SIGKILL to
 * whatever is still there a second later. */
void launch_end_group(pid_t pgid) {
    if (kill(-pgid, SIGTERM)) return;
    for (int i = 0; i < 10 && !kill(-pgid, 0); i++) usleep(100000);
    kill(-pgid, SIGKILL);
}

/* Runs argv (stdout to out_path, stderr discarded) for at most `seconds`, then ends it. 1 when
 * it ended by itself (*status: waitpid's), 0 when it was ended at the time limit, -1 when it
 * could not start or launch is stopping (a signal): then it says nothing about the host. */
int launch_run_quietly(char **argv, const char *out_path, double seconds, int *status) {
    int fd;
    pid_t pid = launch_spawn(argv, NULL, out_path, &fd), job = launch_child;
    *status = 0;
    if (pid < 0) return -1;
    launch_child = pid;
    double end = launch_now() + seconds;
    int done = 0, open = 1;
    char sink[4096];
    while (launch_now() < end && !launch_stop) {
        if (waitpid(pid, status, WNOHANG) == pid) {
            done = 1;
            break;
        }
        struct pollfd pf = {fd, POLLIN, 0};
        if (!open) usleep(100000);
        else if (poll(&pf, 1, 100) > 0 && read(fd, sink, sizeof sink) <= 0) open = 0;
    }
    if (!done) kill_wait(pid, status);
    launch_end_group(pid);   /* anything it left in its group */
    launch_child = job;
    close(fd);
    return done ? 1 : launch_stop ? -1 : 0;
}

/* Does host h run `true` under mpirun within the probe timeout? 1 yes, 0 no, -1 unknown
 * (launch is stopping, or mpirun cannot run at all). */
int launch_probe_host(const Launch *L, const LaunchHost *h) {
    char *extra[] = {"--host", (char *)h->name, "-np", "1", "true", NULL};
    char *buf, **argv = launch_mpirun_argv(L, &buf, extra);
    int status, done = launch_run_quietly(argv, NULL, L->cfg.probe_timeout, &status);
    free(argv), free(buf);
    if (done < 0) return -1;
    return done && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Can path (a file name: looked for on PATH) be run? errno says why not for a path with '/'. */
int launch_mpirun_found(const char *path) {
    if (strchr(path, '/')) return !access(path, X_OK);
    const char *env = getenv("PATH");
    char dirs[8192];
    snprintf(dirs, sizeof dirs, "%s", env ? env : "/usr/bin:/bin");
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        char f[PATH_MAX + 256];
        snprintf(f, sizeof f, "%s/%s", *d ? d : ".", path);
        if (!access(f, X_OK)) return 1;
    }
    return 0;
}

void launch_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);   /* the terminal or ssh session gone: end the job, not leave it running */
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);   /* our stderr may be gone with it: keep going to end the job */
}
