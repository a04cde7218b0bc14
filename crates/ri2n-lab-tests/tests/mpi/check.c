/* An MPI job that checks every result it computes, for the tunnel's lab test and benchmark.
 *
 * usage: check SECONDS [DIVISOR [polite]]
 *
 * Every iteration runs collectives and point-to-point transfers whose results follow from
 * the rank and the iteration number, and checks them exactly: an allreduce of 64 Ki doubles
 * (integers, so the sums are exact), a broadcast of 256 KiB from a rotating root, a 1 MiB
 * exchange around the ring, and an all-to-all of 4 KiB blocks. Rank 0 decides when SECONDS
 * have passed and tells the others. A wrong byte aborts the job with status 3.
 *
 * Rank 0 prints one line a second ("progress t=... iterations=...") and at the end one line
 * per rank: "rank R: iterations N, checked MB M, longest iteration S s, at T s", where the
 * longest iteration is how long the job stood still (a stall shows there) and T when it
 * began (seconds since the start). The last line is "result: ok".
 *
 * DIVISOR (default 1) divides every message size, for jobs of many ranks on few CPUs. With
 * "polite", every operation is non-blocking and each rank waits for it by testing it and
 * sleeping in between, instead of spinning in MPI's progress loop: 32 ranks on 2 CPUs then
 * leave the CPUs to the network (here, the tunnel daemons) while they wait.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long REDUCE_COUNT = 64 * 1024, BCAST_BYTES = 256 * 1024, RING_BYTES = 1024 * 1024,
            A2A_BLOCK = 4096;

static int rank, size, polite;

/* waits for `n` requests: MPI_Waitall, or, polite, tests with sleeps in between that grow
 * from 50 us to 2 ms (a quick operation is seen at once, a long wait costs few tests) */
static void wait_all(int n, MPI_Request *reqs) {
    if (!polite) {
        MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
        return;
    }
    long pause_ns = 50 * 1000;
    for (;;) {
        int done = 0;
        MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (done)
            return;
        struct timespec pause = {0, pause_ns};
        nanosleep(&pause, NULL);
        if (pause_ns < 2000 * 1000)
            pause_ns *= 2;
    }
}

static void fail(const char *what, long iteration, long index) {
    fprintf(stderr, "rank %d: wrong %s in iteration %ld at %ld\n", rank, what, iteration,
            index);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

/* the byte a sender puts at index i of a message in iteration `it` */
static unsigned char pattern(long it, int from, int to, long i) {
    uint64_t x = (uint64_t)it * 1000003u + (uint64_t)from * 7919u + (uint64_t)to * 104729u +
                 (uint64_t)i * 2654435761u;
    return (unsigned char)(x >> 13);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double seconds = argc > 1 ? atof(argv[1]) : 30.0;
    long divisor = argc > 2 ? atol(argv[2]) : 1;
    polite = argc > 3 && strcmp(argv[3], "polite") == 0;
    if (divisor < 1 || divisor > 1024) {
        fprintf(stderr, "rank %d: DIVISOR must be 1 to 1024\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    REDUCE_COUNT /= divisor;
    BCAST_BYTES /= divisor;
    RING_BYTES /= divisor;
    A2A_BLOCK /= divisor;
    MPI_Request reqs[2];

    double *values = malloc(REDUCE_COUNT * sizeof(double));
    double *sums = malloc(REDUCE_COUNT * sizeof(double));
    unsigned char *bcast = malloc(BCAST_BYTES);
    unsigned char *out = malloc(RING_BYTES), *in = malloc(RING_BYTES);
    unsigned char *a2a_out = malloc((size_t)A2A_BLOCK * size);
    unsigned char *a2a_in = malloc((size_t)A2A_BLOCK * size);
    if (!values || !sums || !bcast || !out || !in || !a2a_out || !a2a_in) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }

    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime(), last = start, next_report = 1.0;
    double longest = 0.0, longest_at = 0.0;
    long it = 0;
    double checked = 0.0;
    int go = 1;
    while (go) {
        /* allreduce: element i of rank r is (it + r + i) % 1000; the sum is known */
        for (long i = 0; i < REDUCE_COUNT; i++)
            values[i] = (double)((it + rank + i) % 1000);
        MPI_Iallreduce(values, sums, REDUCE_COUNT, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, reqs);
        wait_all(1, reqs);
        for (long i = 0; i < REDUCE_COUNT; i++) {
            double want = 0;
            for (int r = 0; r < size; r++)
                want += (double)((it + r + i) % 1000);
            if (sums[i] != want)
                fail("allreduce sum", it, i);
        }

        /* broadcast from a rotating root */
        int root = (int)(it % size);
        if (rank == root)
            for (long i = 0; i < BCAST_BYTES; i++)
                bcast[i] = pattern(it, root, -1, i);
        else
            memset(bcast, 0, BCAST_BYTES);
        MPI_Ibcast(bcast, BCAST_BYTES, MPI_BYTE, root, MPI_COMM_WORLD, reqs);
        wait_all(1, reqs);
        for (long i = 0; i < BCAST_BYTES; i++)
            if (bcast[i] != pattern(it, root, -1, i))
                fail("broadcast byte", it, i);

        /* ring: send to the right, receive from the left */
        int right = (rank + 1) % size, left = (rank + size - 1) % size;
        for (long i = 0; i < RING_BYTES; i++)
            out[i] = pattern(it, rank, right, i);
        MPI_Irecv(in, RING_BYTES, MPI_BYTE, left, 7, MPI_COMM_WORLD, &reqs[0]);
        MPI_Isend(out, RING_BYTES, MPI_BYTE, right, 7, MPI_COMM_WORLD, &reqs[1]);
        wait_all(2, reqs);
        for (long i = 0; i < RING_BYTES; i++)
            if (in[i] != pattern(it, left, rank, i))
                fail("ring byte", it, i);

        /* all-to-all: block j goes to rank j */
        for (int j = 0; j < size; j++)
            for (long i = 0; i < A2A_BLOCK; i++)
                a2a_out[(size_t)j * A2A_BLOCK + i] = pattern(it, rank, j, i);
        MPI_Ialltoall(a2a_out, A2A_BLOCK, MPI_BYTE, a2a_in, A2A_BLOCK, MPI_BYTE,
                      MPI_COMM_WORLD, reqs);
        wait_all(1, reqs);
        for (int j = 0; j < size; j++)
            for (long i = 0; i < A2A_BLOCK; i++)
                if (a2a_in[(size_t)j * A2A_BLOCK + i] != pattern(it, j, rank, i))
                    fail("all-to-all byte", it, (long)j * A2A_BLOCK + i);

        checked += (REDUCE_COUNT * sizeof(double) + BCAST_BYTES + RING_BYTES +
                    (double)A2A_BLOCK * size) / 1e6;
        it++;
        double now = MPI_Wtime();
        if (now - last > longest) {
            longest = now - last;
            longest_at = last - start;
        }
        last = now;
        if (rank == 0) {
            go = now - start < seconds;
            if (now - start >= next_report) {
                printf("progress t=%.1f iterations=%ld\n", now - start, it);
                fflush(stdout);
                next_report = (double)(long)(now - start) + 1.0;
            }
        }
        MPI_Ibcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD, reqs);
        wait_all(1, reqs);
    }

    /* every rank's summary, printed by rank 0 in rank order */
    double mine[4] = {(double)it, checked, longest, longest_at};
    double *all = rank == 0 ? malloc(sizeof(mine) * size) : NULL;
    MPI_Gather(mine, 4, MPI_DOUBLE, all, 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        for (int r = 0; r < size; r++)
            printf("rank %d: iterations %.0f, checked MB %.0f, longest iteration %.3f s, "
                   "at %.1f s\n",
                   r, all[4 * r], all[4 * r + 1], all[4 * r + 2], all[4 * r + 3]);
        printf("result: ok\n");
        fflush(stdout);
    }
    MPI_Finalize();
    return 0;
}
