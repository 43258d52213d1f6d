/* MPI_Allreduce in a loop for SECONDS seconds (argv[1], default 60): a job whose every step needs every rank over
 * the network, as a bulk-synchronous application's. Rank 0 prints the step count once a second; a rank that
 * finds a wrong sum exits 1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int rank, size;
    double seconds = argc > 1 ? atof(argv[1]) : 60.0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long want = (long)size * (size - 1) / 2;
    double start = MPI_Wtime(), said = start;
    long steps = 0;
    int done = 0;
    while (!done) {
        long mine = rank, sum = 0;
        MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (sum != want) {
            printf("rank %d: allreduce sum %ld WRONG at step %ld\n", rank, sum, steps);
            return 1;
        }
        steps++;
        /* Rank 0's clock decides when to stop, for every rank at the same step. */
        int stop = rank == 0 && MPI_Wtime() - start >= seconds;
        MPI_Bcast(&stop, 1, MPI_INT, 0, MPI_COMM_WORLD);
        done = stop;
        if (rank == 0 && MPI_Wtime() - said >= 1.0) {
            said = MPI_Wtime();
            printf("allreduce steps %ld\n", steps);
            fflush(stdout);
        }
    }
    if (rank == 0)
        printf("allreduce loop OK: %ld steps\n", steps);
    MPI_Finalize();
    return 0;
}
