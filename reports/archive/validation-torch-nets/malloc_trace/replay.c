/* Replays a trace of record.c through this process's glibc (every allocation written in full, frees
   paired by the recorded pointer), counting minor faults per step between marks. kinds: 0 tensors only
   (posix_memalign), 3 every allocation. A diagnosis tool of reports/archive/validation-torch-nets/glibc_replay_probe.py. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
typedef struct { uint64_t op, ptr, size, old; } rec_t;
#define HB (1u<<24)
static uint64_t *hk, *hv;
static uint64_t *slot(uint64_t k){ uint64_t h=(k*0x9E3779B97F4A7C15ull)>>40; while(hk[h&(HB-1)] && hk[h&(HB-1)]!=k) h++; return &hk[h&(HB-1)]; }
static void put(uint64_t k, uint64_t v){ uint64_t*s=slot(k); *s=k; hv[s-hk]=v; }
static uint64_t take(uint64_t k){ uint64_t*s=slot(k); if(!*s) return 0; uint64_t v=hv[s-hk]; *s=0; /* tombstone-free delete: rehash cluster */
  size_t i=(s-hk+1)&(HB-1); while(hk[i]){ uint64_t kk=hk[i], vv=hv[i]; hk[i]=0; put(kk,vv); i=(i+1)&(HB-1);} return v; }
static long flt(void){ struct rusage u; getrusage(RUSAGE_SELF,&u); return u.ru_minflt; }
/* mode bit0: replay small (<= small_max) allocations too; returns faults in steps [from, to) into out[] per step */
int replay(const char*path, size_t small_max, int from, int to, double*out, int kinds){
  FILE*f=fopen(path,"rb"); fseek(f,0,SEEK_END); size_t n=ftell(f)/sizeof(rec_t); fseek(f,0,SEEK_SET);
  rec_t*r=mmap(0,n*sizeof(rec_t),PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); fread(r,sizeof(rec_t),n,f); fclose(f);
  hk=mmap(0,HB*8,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); hv=mmap(0,HB*8,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  long f0=0; int step=-1;
  for(size_t i=0;i<n;i++){ rec_t e=r[i];
    if(e.op=='m'){ long now=flt(); if(step>=from && step<to) out[step-from]=(now-f0)*4096.0/1048576.0; step=(int)e.size; f0=now; continue; }
    int tensor = (e.op=='p');
    if(e.op=='f'){ uint64_t v=take(e.ptr); if(v) free((void*)v); continue; }
    if(!tensor && !(kinds&1)) continue;
    if(!tensor && e.size>small_max) { if(!(kinds&2)) continue; }
    if(e.op=='r'){ uint64_t v= e.old? take(e.old):0; void*p=realloc((void*)v,e.size); if(p){ memset(p,1,e.size); put(e.ptr,(uint64_t)p);} continue; }
    void*p; if(tensor){ if(posix_memalign(&p,64,e.size)) p=0; } else p=malloc(e.size);
    if(p){ memset(p,1,e.size); put(e.ptr,(uint64_t)p); }
  }
  return 0;
}
