"""gRPC servicers of the executor process (proto <-> domain only, no SQL).

* ``connector.v1.AdminService`` lives in ``connector.executor.admin`` and is mounted by
  ``ExecutorService`` (``service.py``) on this process's gRPC server.
* ``work_handler.WorkHandlerServicer`` turns a python callable into a remote
  ``connector.v1.WorkHandlerService`` — what a ``grpc`` handler kind calls.
"""
