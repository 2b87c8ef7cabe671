// ns per operation in a tight loop: an atomic exchange, a compare-and-swap, an indirect call,
// a thread-local add, an empty iteration. For comparing hosts (scripts/gpu/probe_host.sh).
//   gcc -O2 -o micro scripts/gpu/probe_micro.c && ./micro
#include <stdio.h>
#include <stdint.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static volatile long v;
__attribute__((noinline)) long f(long x){return x+1;}
long (*volatile fp)(long)=f;
static __thread long tl;
int main(void){
  const long N=50000000; double t; long s=0;
  t=now(); for(long i=0;i<N;i++) __atomic_exchange_n(&v,i,__ATOMIC_ACQ_REL); printf("xchg ns=%.2f\n",(now()-t)/N);
  t=now(); for(long i=0;i<N;i++) { long e=v; __atomic_compare_exchange_n(&v,&e,i,0,__ATOMIC_ACQ_REL,__ATOMIC_ACQUIRE);} printf("cas ns=%.2f\n",(now()-t)/N);
  t=now(); for(long i=0;i<N;i++) s+=fp(i); printf("indirect-call ns=%.2f\n",(now()-t)/N);
  t=now(); for(long i=0;i<N;i++) {tl+=i; __asm__ volatile(""::: "memory");} printf("tls ns=%.2f\n",(now()-t)/N);
  t=now(); for(long i=0;i<N;i++) {s+=i*7; __asm__ volatile(""::: "memory");} printf("loop ns=%.2f\n",(now()-t)/N);
  return (int)(s&1);
}
