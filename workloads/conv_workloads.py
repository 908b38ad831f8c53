"""The KernelBench convolution workloads (18k, 22k, 25k, 28k, 33k, 34k, 39k, 46k)."""

CONV_WORKLOADS: tuple = ()
