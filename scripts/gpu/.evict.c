#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
#ifdef REAL
#include <cuda.h>
#else
#include "cuda_min.h"
#endif
#ifndef REAL
CUresult cuInit(unsigned); CUresult cuDeviceGet(CUdevice*, int); CUresult cuDevicePrimaryCtxRetain(CUcontext*, CUdevice);
CUresult cuCtxSetCurrent(CUcontext); CUresult cuMemAlloc_v2(CUdeviceptr*, size_t); CUresult cuMemFree_v2(CUdeviceptr);
#endif
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static volatile char *buf; static size_t kb;
static void evict(void){ for (size_t i=0;i<kb*1024;i+=64) buf[i]++; }
int main(int argc,char**argv){ size_t size=strtoull(argv[1],0,10); long n=atol(argv[2]); kb=atol(argv[3]);
 buf=malloc(kb*1024+64); CUdevice d; CUcontext c; cuInit(0); cuDeviceGet(&d,0); cuDevicePrimaryCtxRetain(&c,d); cuCtxSetCurrent(c);
 CUdeviceptr p; for(int i=0;i<1000;i++){cuMemAlloc_v2(&p,size);cuMemFree_v2(p);}
 double best=1e18, bestE=1e18;
 for(int r=0;r<5;r++){ double t=now(); for(long i=0;i<n;i++){ if(kb) evict(); cuMemAlloc_v2(&p,size); cuMemFree_v2(p);} double a=(now()-t)/n;
  t=now(); for(long i=0;i<n;i++){ if(kb) evict(); __asm__ volatile("":::"memory");} double e=(now()-t)/n; if(a<best)best=a; if(e<bestE)bestE=e; }
 printf("size=%zu evict=%zuKiB pair_ns=%.1f (total %.1f - evict %.1f)\n", size, kb, best-bestE, best, bestE); }
