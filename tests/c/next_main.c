// Calls getpid() through whatever interposers are preloaded and checks it against the kernel.
#define _GNU_SOURCE
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void) {
  pid_t a = getpid();
  pid_t b = (pid_t)syscall(SYS_getpid);
  printf("getpid=%s\n", a == b ? "ok" : "wrong");
  return a == b ? 0 : 1;
}
