/* Rank 1 calls MPI_Abort(7) while the others wait in a barrier: the job must end with exit code 7, not hang. */
#include <mpi.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    /* Everyone past MPI_Init first: a rank still in its address exchange when rank 1 is gone fails there with an
       abort of its own (UCX: "Shared memory error"), whose code may reach the job first. */
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1)
        MPI_Abort(MPI_COMM_WORLD, 7);
    MPI_Barrier(MPI_COMM_WORLD);
    sleep(60);
    MPI_Finalize();
    return 0;
}
