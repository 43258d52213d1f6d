#!/bin/sh
# Print where this task runs: its rank, its node and the cpus it is bound to.
cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
echo "task ${VIGIL_TASK_RANK} of ${VIGIL_JOB_SIZE} on $(hostname) (broker rank ${VIGIL_BROKER_RANK}, local task ${VIGIL_TASK_LOCAL_RANK}): bound to cpus ${cpus}"
