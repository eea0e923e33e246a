/*
 * pause: the process that holds a pod sandbox's namespaces open.
 *
 * Modelled on Kubernetes' build/pause/linux/pause.c: it blocks in pause()
 * forever, reaps any zombie re-parented to it (it is PID 1 of the pod when
 * the PID namespace is shared), and exits 0 on SIGINT or SIGTERM so that a
 * pod sandbox stops promptly.  Unlike the upstream file, the signal handlers
 * only use async-signal-safe calls (write, waitpid, _exit).
 *
 * Built by images/build.sh with `gcc -static -Os`; the image holds only
 * /pause.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef VERSION
#define VERSION "sandboxrun-pause 3.10"
#endif

/* Writes a constant message to stderr; safe inside a signal handler. */
static void say(const char *msg) {
  ssize_t ignored = write(STDERR_FILENO, msg, strlen(msg));
  (void)ignored;
}

/* SIGINT/SIGTERM: the sandbox is being torn down, leave cleanly. */
static void sigdown(int signo) {
  say(signo == SIGINT ? "pause: got SIGINT, shutting down\n"
                      : "pause: got SIGTERM, shutting down\n");
  _exit(0);
}

/* SIGCHLD: reap every child that has exited, so no zombie is left behind. */
static void sigreap(int signo) {
  int saved = errno;
  (void)signo;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  errno = saved;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-v") == 0 || strcmp(argv[i], "--version") == 0) {
      printf("%s\n", VERSION);
      return 0;
    }
  }

  if (getpid() != 1) {
    /* Not an error: useful when run by hand or without a PID namespace. */
    say("pause: warning: not running as PID 1\n");
  }

  struct sigaction down = {0};
  down.sa_handler = sigdown;
  sigemptyset(&down.sa_mask);
  if (sigaction(SIGINT, &down, NULL) < 0 || sigaction(SIGTERM, &down, NULL) < 0) {
    perror("pause: sigaction(SIGINT/SIGTERM)");
    return 1;
  }

  struct sigaction reap = {0};
  reap.sa_handler = sigreap;
  sigemptyset(&reap.sa_mask);
  reap.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  if (sigaction(SIGCHLD, &reap, NULL) < 0) {
    perror("pause: sigaction(SIGCHLD)");
    return 2;
  }

  for (;;) {
    pause();
  }

  /* Unreachable: pause() only returns to run a handler. */
  say("pause: error: infinite loop terminated\n");
  return 42;
}
