/* Ring exchange with MPI_Sendrecv: each rank sends its rank to the right and must receive its left neighbour's. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int rank, size, got = -1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    MPI_Sendrecv(&rank, 1, MPI_INT, right, 0, &got, 1, MPI_INT, left, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    printf("rank %d: received %d from rank %d %s\n", rank, got, left, got == left ? "OK" : "WRONG");
    MPI_Finalize();
    return got == left ? 0 : 1;
}
