/* A C gateway's spawning function, built twice by tests/build.rs: with frame pointers
 * (`spawn_leaky_helper_fp`) and without (`spawn_leaky_helper_nofp`). Either way it forks
 * through the C library's fork(), which keeps none on Debian: the kernel's frame-pointer
 * walk stops there, and the spawner's stack is copied and unwound instead. */
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
