"""The reading side (D): start reads from serving endpoints and poll them from the step
loop (`client`), its IO thread (`client_io`), its records (`read_jobs`) and the handle a
read returns (`handle`)."""
