/* MPI_Allreduce check: the sum of ranks 0..size-1 must equal size*(size-1)/2 on every rank. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int rank, size;
    long mine, sum = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    mine = rank;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    long want = (long)size * (size - 1) / 2;
    printf("rank %d: allreduce sum %ld %s\n", rank, sum, sum == want ? "OK" : "WRONG");
    MPI_Finalize();
    return sum == want ? 0 : 1;
}
