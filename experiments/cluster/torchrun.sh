#!/usr/bin/env bash
# One grid cell on N nodes x G processes through torchrun (Lightning's TorchElastic
# environment: RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK set by torchrun).  Run it on every
# node with the same MASTER_ADDR / MASTER_PORT and that node's NODE_RANK:
#
#   NNODES=2 NPROC_PER_NODE=4 NODE_RANK=0 MASTER_ADDR=node0 MASTER_PORT=29500 \
#       experiments/cluster/torchrun.sh coda_mt table4 coda 0 paper
#   experiments/cluster/torchrun.sh EXPERIMENT GRID CELL [SEED] [CONFIG] [-- OVERRIDES...]
#
# As experiments/cluster/slurm.sbatch: the cell's own `fit` command (`grid --dry-run`) with
# --trainer.num_nodes / --trainer.devices / --trainer.strategy=ddp added.  Environment:
# NNODES (1), NPROC_PER_NODE (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1), MASTER_PORT
# (29500), ATTNREPRO_PYTHON (.venv/bin/python), ACCELERATOR (gpu), SUBCOMMAND (fit).
set -euo pipefail
cd "$(dirname "$0")/../.."
mapfile -t cmd < <(experiments/cluster/cell_command "$@")
nnodes=${NNODES:-1}
nproc=${NPROC_PER_NODE:-1}
# cmd[0] is the interpreter: torchrun runs the script with its own
exec "$(dirname "${cmd[0]}")/torchrun" --nnodes="$nnodes" --nproc-per-node="$nproc" \
    --node-rank="${NODE_RANK:-0}" --master-addr="${MASTER_ADDR:-127.0.0.1}" \
    --master-port="${MASTER_PORT:-29500}" "${cmd[@]:1}" --trainer.num_nodes="$nnodes" \
    --trainer.devices="$nproc" --trainer.strategy=ddp --trainer.accelerator="${ACCELERATOR:-gpu}"
