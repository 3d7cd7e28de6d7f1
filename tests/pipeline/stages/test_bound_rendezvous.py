"""pipeline/stages/bound_rendezvous.py: a store that listens on the address it is given only, and
the backend torch's registry builds from it (the launcher's two-process runs are in
test_train_launch.py, the two hosts' in tests/team/test_two_host_training.py)."""

from __future__ import annotations

from datetime import timedelta

import psutil
import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

from pipeline.stages import bound_rendezvous

pytestmark = pytest.mark.fast


def listening_ports() -> dict[int, str]:
    return {c.laddr.port: c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def test_a_bound_store_listens_on_its_address_only_and_serves():
    store = bound_rendezvous.bound_store("127.0.0.1", 0, timedelta(seconds=10))
    assert store.port > 0
    assert listening_ports()[store.port] == "127.0.0.1"
    client = TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=10))
    client.set("rank0", "ready")
    assert store.get("rank0") == b"ready"
    # The plain constructor, as torch's c10d backend calls it, listens on every interface.
    plain = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, timeout=timedelta(seconds=10))
    assert listening_ports()[plain.port] in {"::", "0.0.0.0"}


def test_the_registry_builds_the_bound_backend():
    before = listening_ports()
    bound_rendezvous.register()
    bound_rendezvous.register()   # again: the same creator, no error
    params = RendezvousParameters(backend=bound_rendezvous.BACKEND, endpoint="127.0.0.1:0", run_id="t",
                                  min_nodes=1, max_nodes=1, local_addr="127.0.0.1", is_host="true",
                                  join_timeout="30")
    handler = rendezvous_handler_registry.create_handler(params)
    assert isinstance(handler, bound_rendezvous.BoundRendezvousHandler)
    assert handler.get_backend() == bound_rendezvous.BACKEND
    assert handler.settings.timeout.join == timedelta(seconds=30)
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size, info.bootstrap_store_info.master_addr) == (0, 1, "127.0.0.1")
    opened = {port: ip for port, ip in listening_ports().items() if port not in before}
    assert len(opened) == 2 and info.bootstrap_store_info.master_port in opened, opened   # the two stores
    assert set(opened.values()) == {"127.0.0.1"}, opened
    handler.shutdown()
