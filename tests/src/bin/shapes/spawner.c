/* A C gateway's spawning functions, built twice by tests/build.rs: with frame pointers
 * (`spawn_leaky_helper_fp`, `spawn_other_helper_fp`) and without (`..._nofp`). Either way they
 * fork through the C library's fork(), which keeps none on Debian: the kernel's frame-pointer
 * walk stops there, and the spawner's stack is copied and unwound instead. Two callers of the
 * same wrapper are two sites, each named as itself. */
#include <stdio.h>
#include <unistd.h>

/* Forks; the child gets 0, the parent the child's pid. Not inlined, and the call is not a
 * tail call (perror may follow it), so this function has a frame of its own at the fork. */
__attribute__((noinline)) int SPAWN_FN(void)
{
    pid_t pid = fork();
    if (pid < 0)
        perror("fork");
    return pid;
}

/* The same as SPAWN_FN from another function (its message differs, so the compiler cannot
 * fold the two into one). */
__attribute__((noinline)) int SPAWN_OTHER_FN(void)
{
    pid_t pid = fork();
    if (pid < 0)
        perror("fork (other)");
    return pid;
}
