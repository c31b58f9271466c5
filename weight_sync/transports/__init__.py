"""The ways weight_sync moves a version into a server, one module each (see
weight_sync.protocols.Transport):

- disk: the version's verified checkpoint, loaded by the server (/update_weights_from_disk);
- distributed: the version's tensors held in memory, broadcast over a weight-update group of
  the server's own (NCCL on GPU, gloo on CPU);
- base: nothing published yet: the server keeps the base weights it started with.
"""
