/* STREAM's triad kernel (a[i] = b[i] + q * c[i]) on arrays far larger than the caches,
 * with OpenMP threads, as in McCalpin's stream.c: the memory bandwidth a decode step can
 * hope for. Counts 24 bytes per element (two reads, one write), STREAM's convention.
 *
 *   gcc -O3 -march=native -fopenmp scripts/stream_triad.c -o stream_triad
 *   OMP_NUM_THREADS=2 ./stream_triad [elements, default 80M] [repetitions, default 20]
 *
 * Prints the best and the median repetition in GB/s (1e9 bytes/s).
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 80L * 1000 * 1000;
    int reps = argc > 2 ? atoi(argv[2]) : 20;
    if (n <= 0 || reps <= 0) {
        fprintf(stderr, "usage: %s [elements > 0] [repetitions > 0]\n", argv[0]);
        return 2;
    }
    double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    double *gbs = malloc(reps * sizeof *gbs);
    if (!a || !b || !c || !gbs) {
        fprintf(stderr, "cannot allocate 3 x %ld doubles\n", n);
        return 1;
    }
#pragma omp parallel for
    for (long i = 0; i < n; i++) {
        a[i] = 1.0;
        b[i] = 2.0;
        c[i] = 0.0;
    }
    const double q = 3.0;
    for (int r = 0; r < reps; r++) {
        double t = omp_get_wtime();
#pragma omp parallel for
        for (long i = 0; i < n; i++) a[i] = b[i] + q * c[i];
        t = omp_get_wtime() - t;
        gbs[r] = 24.0 * n / t / 1e9;
        c[r % n] += a[(r * 7) % n]; /* keep every repetition live */
    }
    qsort(gbs, reps, sizeof *gbs, cmp);
    printf("threads %d  elements %ld  triad best %.1f GB/s  median %.1f GB/s\n",
           omp_get_max_threads(), n, gbs[reps - 1], gbs[reps / 2]);
    return 0;
}
