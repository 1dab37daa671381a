#include <stdio.h>
#include <cpuid.h>
#include <time.h>
int main(){ unsigned a,b,c,d; struct timespec t0,t1; int n=2000;
 for (int leaf=0; leaf<5; leaf++){
 clock_gettime(CLOCK_MONOTONIC,&t0);
 for(int i=0;i<n;i++){ __cpuid_count(leaf,0,a,b,c,d);}
 clock_gettime(CLOCK_MONOTONIC,&t1);
 printf("leaf %d: %.2f us\n",leaf,((t1.tv_sec-t0.tv_sec)*1e9+(t1.tv_nsec-t0.tv_nsec))/n/1000.0);}
}
