"""The c10d rendezvous with its stores bound to one address, not to every interface.

torch's ``c10d`` backend starts two ``TCPStore`` servers in the launcher of the host that serves
the rendezvous: the rendezvous's own (at ``PIPELINE_RDZV_ENDPOINT``) and the one the training
processes share (``MASTER_ADDR``/``MASTER_PORT``). Both listen on every interface (``::``) whatever
address they were given, and neither authenticates anything (their values are pickled). This backend
is the same ``DynamicRendezvousHandler`` over the same c10d store protocol, with both servers
listening on a socket bound to one address (``TCPStore``'s ``master_listen_fd``):

- one host: ``127.0.0.1`` (the endpoint ``127.0.0.1:0`` and the local address ``127.0.0.1``), so
  nothing of a training listens off loopback;
- several hosts: the rendezvous store on the address the endpoint's host name resolves to, the
  shared store on the serving host's ``PIPELINE_LOCAL_ADDR``: the interface that faces the other
  hosts, and no other (docs/two_hosts.md).

Registered with torch's rendezvous registry as :data:`BACKEND`; ``launch`` names it in its
``LaunchConfig``. Same settings as ``c10d`` (``join_timeout``, ``read_timeout``, ...), except that
the serving host is said by ``is_host`` (``Rendezvous.from_env`` requires it with several hosts),
not guessed from the host name.
"""

from __future__ import annotations

import socket
from datetime import timedelta

from torch.distributed import Store, TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, RendezvousTimeout
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

BACKEND = "pipeline-c10d"
DEFAULT_PORT = 29400       # c10d's own default
READ_TIMEOUT_S = 60        # c10d's own default for ``read_timeout``


def bound_store(host: str, port: int, timeout: timedelta) -> TCPStore:
    """A ``TCPStore`` server listening on ``host:port`` only (port 0: a free one), as
    ``TCPStore(host, port, is_master=True)`` would be if it bound the address it is given."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(socket.SOMAXCONN)
        bound_port = listener.getsockname()[1]
    except OSError:
        listener.close()
        raise
    # The store owns the descriptor from here (its server closes it), so Python must not.
    return TCPStore(address[0], bound_port, is_master=True, multi_tenant=True, timeout=timeout,
                    master_listen_fd=listener.detach())


class BoundRendezvousHandler(DynamicRendezvousHandler):
    """torch's handler, with the store the training processes share bound to this node's address
    (``local_addr``: 127.0.0.1 on one host) instead of every interface."""

    def get_backend(self) -> str:
        return BACKEND

    def _create_tcp_store_server(self, master_addr: str, master_port: int) -> TCPStore:
        return bound_store(master_addr, master_port, timedelta(seconds=READ_TIMEOUT_S))


def _rendezvous_store(params: RendezvousParameters) -> Store:
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=DEFAULT_PORT)
    timeout = timedelta(seconds=params.get_as_int("read_timeout", READ_TIMEOUT_S) or READ_TIMEOUT_S)
    if params.get_as_bool("is_host", False):
        return bound_store(host, port, timeout)
    return TCPStore(host, port, is_master=False, multi_tenant=True, timeout=timeout)


def _timeout(params: RendezvousParameters, name: str) -> timedelta | None:
    seconds = params.get_as_int(f"{name}_timeout")
    return None if seconds is None else timedelta(seconds=seconds)


def create_bound_handler(params: RendezvousParameters) -> BoundRendezvousHandler:
    """The handler torch's ``c10d`` backend makes (its ``create_handler``: the same timeouts and
    keep-alive settings), over a store bound as the module says."""
    store = _rendezvous_store(params)
    timeout = RendezvousTimeout(*(_timeout(params, name) for name in ("join", "last_call", "close", "heartbeat")))
    return BoundRendezvousHandler.from_backend(
        params.run_id, store, C10dRendezvousBackend(store, params.run_id), params.min_nodes, params.max_nodes,
        params.local_addr, timeout, keep_alive_interval=params.get_as_int("keep_alive_interval", 5) or 5,
        keep_alive_max_attempt=params.get_as_int("keep_alive_max_attempt", 3) or 3)


def register() -> None:
    """Make :data:`BACKEND` known to torch's registry (registering the same creator again is a no-op)."""
    rendezvous_handler_registry.register(BACKEND, create_bound_handler)
