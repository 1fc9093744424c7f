"""How the learner spreads over torchrun's ranks. The process group and the orders rank 0 broadcasts
(ranks.py); one ParallelStrategy per Trainer (strategy.py), chosen once at construction (choose.py): one
process or DDP (data_parallel.py), or FSDP2 (fsdp2.py). The strategy places, wraps and reduces the network,
clips its gradients, scales the loss for the reduction, counts a rank's forwards, reads a push's weights, holds
the format its checkpoints are written in and loads a checkpoint's state."""
