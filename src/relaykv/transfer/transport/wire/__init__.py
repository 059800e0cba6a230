"""Wire and security of the transfer plane: control messages between a reader and a
serving endpoint (`control`), their ZeroMQ sockets (`sockets`), the cluster secret that
authenticates them (`auth`) and page digests (`integrity`)."""
