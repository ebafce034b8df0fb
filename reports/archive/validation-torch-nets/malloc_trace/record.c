/* LD_PRELOAD interposer: logs every malloc/calloc/realloc/aligned allocation/free of the process between
   mtr_start() and mtr_stop(path) as fixed 32-byte records (op, pointer, bytes, old pointer), mtr_mark(k)
   between steps. A diagnosis tool of reports/archive/validation-torch-nets/glibc_replay_probe.py (--whole). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <stdio.h>
#include <stdint.h>
#include <errno.h>
#include <sys/mman.h>
typedef struct { uint64_t op, ptr, size, old; } rec_t;
static rec_t *buf; static size_t n, cap = 20000000; static int on;
extern void *__libc_malloc(size_t); extern void __libc_free(void*); extern void *__libc_calloc(size_t,size_t);
extern void *__libc_realloc(void*,size_t); extern void *__libc_memalign(size_t,size_t);
static void add(int op, void*p, size_t s, void*o){ if(on){ size_t i=__atomic_fetch_add(&n,1,__ATOMIC_RELAXED); if(i<cap){ buf[i].op=op; buf[i].ptr=(uint64_t)p; buf[i].size=s; buf[i].old=(uint64_t)o; } } }
void mtr_start(void){ if(!buf) buf = mmap(0, cap*sizeof(rec_t), PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE, -1, 0); n=0; on=1; }
void mtr_mark(size_t k){ add('m', 0, k, 0); }
size_t mtr_stop(const char*path){ on=0; FILE*f=fopen(path,"wb"); fwrite(buf,sizeof(rec_t),n,f); fclose(f); return n; }
void *malloc(size_t s){ void*p=__libc_malloc(s); add('a',p,s,0); return p; }
void free(void*p){ if(p) add('f',p,0,0); __libc_free(p); }
void *calloc(size_t a,size_t b){ void*p=__libc_calloc(a,b); add('c',p,a*b,0); return p; }
void *realloc(void*o,size_t s){ void*p=__libc_realloc(o,s); add('r',p,s,o); return p; }
void *memalign(size_t al,size_t s){ void*p=__libc_memalign(al,s); add('p',p,s,0); return p; }
void *aligned_alloc(size_t al,size_t s){ void*p=__libc_memalign(al,s); add('p',p,s,0); return p; }
int posix_memalign(void**r,size_t al,size_t s){ void*p=__libc_memalign(al,s); if(!p) return ENOMEM; *r=p; add('p',p,s,0); return 0; }
