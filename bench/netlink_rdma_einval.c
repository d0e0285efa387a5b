/* Runs a command with socket(AF_NETLINK, *, NETLINK_RDMA) failing with EINVAL, as on a kernel
 * without RDMA netlink; every other system call is untouched. bench/deviceplugin.py builds it
 * (cc, into its cache folder) and starts both device plugins through it, alike: the Go
 * k8s-rdma-shared-dev-plugin exits at start when RDMA netlink answers but has no RDMA
 * subsystem ("can not get RDMA subsystem network namespace mode"), and carries on after EINVAL.
 * When EXEC_STAMP names a file, the CLOCK_MONOTONIC time of the exec is written there: where
 * the bench starts its clock for both plugins, after the namespace setup.
 *
 *     netlink_rdma_einval COMMAND [ARG...]
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/netlink.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define LOAD(field) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, field))
#define SKIP_UNLESS(value, n) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (value), 0, (n))

int main(int argc, char **argv) {
    struct sock_filter filter[] = {
        LOAD(arch),
        SKIP_UNLESS(AUDIT_ARCH_X86_64, 7),
        LOAD(nr),
        SKIP_UNLESS(__NR_socket, 5),
        LOAD(args[0]),
        SKIP_UNLESS(AF_NETLINK, 3),
        LOAD(args[2]),
        SKIP_UNLESS(NETLINK_RDMA, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EINVAL & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {sizeof(filter) / sizeof(filter[0]), filter};
    if (argc < 2) {
        fprintf(stderr, "usage: %s COMMAND [ARG...]\n", argv[0]);
        return 2;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program)) {
        perror("seccomp");
        return 1;
    }
    const char *stamp = getenv("EXEC_STAMP");
    if (stamp) {
        struct timespec now;
        FILE *f = fopen(stamp, "w");
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (f) {
            fprintf(f, "%lld.%09ld\n", (long long)now.tv_sec, now.tv_nsec);
            fclose(f);
        }
    }
    execvp(argv[1], argv + 1);
    perror(argv[1]);
    return 127;
}
