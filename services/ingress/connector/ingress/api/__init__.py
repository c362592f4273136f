"""gRPC servicers of the ingress: proto <-> domain only, no SQL."""
