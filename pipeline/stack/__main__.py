"""``python -m pipeline.stack start|stop|status|remote``: the team's services on this machine.

start   start what is not running (PostgreSQL, the S3 store, MLflow, Prefect), in that order; every
        port is checked first; writes <dir>/env and, in a DVC repository, its remote
stop    stop them by their recorded PIDs and process groups, in reverse order, waiting until each has
        exited (leftovers of a crashed service included)
status  each service's PID, address and answer to a real request, or the leftovers of a crash;
        exit 1 if any is down
remote  point this clone's DVC at the remote the sourced env file names (.dvc/config.local)
push    dvc push --run-cache to it; pull: dvc pull from it (one clear error naming the remote)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pipeline.stack import client_env, remote
from pipeline.stack.groups import port_holder
from pipeline.stack.mlflow_service import MlflowServer
from pipeline.stack.objectstore import ObjectStore, weed_binary
from pipeline.stack.postgres import Postgres, bin_dir
from pipeline.stack.prefect_service import PrefectServer
from pipeline.stack.processes import StackError, port_taken, read_pid
from pipeline.stack.secrets import StackSecrets, write_pgpass
from pipeline.stack.secrets import read as read_secrets
from pipeline.stack.secrets import save as save_secrets
from pipeline.stack.service import Service
from pipeline.stack.settings import SettingsError, StackSettings, load

SERVICE_TYPES: tuple[type[Service], ...] = (Postgres, ObjectStore, MlflowServer, PrefectServer)


def services(settings: StackSettings, secrets: StackSecrets | None = None) -> list[Service]:
    """The four services, with the stack's secrets (read, or generated in memory: nothing is written)."""
    secrets = secrets or read_secrets(settings.path("secrets"))[0]
    return [kind(settings, secrets) for kind in SERVICE_TYPES]


def check_ports(todo: list[Service]) -> None:
    """Every port of every service about to start must be free: one error naming each that is not,
    and what holds it."""
    taken = [f"{port} ({name}, held by {port_holder(port)})" for service in todo for name in service.port_names
             if port_taken(service.settings.host, port := service.settings.port(name))]
    if taken:
        raise StackError(f"port{'s' if len(taken) > 1 else ''} {', '.join(taken)} on {todo[0].settings.host} "
                         f"already in use by another program; nothing was started. Choose other ports with "
                         f"STACK_PORT_BASE (now {todo[0].settings.port_base}) on a stack's first start")


def end_leftovers(todo: list[Service]) -> None:
    """What a crashed service left running (its recorded group's members) ends before the start."""
    for service in todo:
        stray, group = service.leftovers(), read_pid(service.pid_file)
        if stray:
            service.stop()
            print(f"{service.name:9s} ended the leftovers of a crashed start: pids {', '.join(map(str, stray))} "
                  f"of its process group {group}", flush=True)


def start(settings: StackSettings) -> None:
    """Start what is not running. Until every check has passed (programs, leftovers, ports), nothing
    is written: a refused start leaves no folder, secret or setting behind."""
    secrets_dir = settings.path("secrets")
    secrets, complete = read_secrets(secrets_dir)
    all_services = services(settings, secrets)
    running = {s.name: s.pid() for s in all_services}
    saved = load(settings.directory)
    if any(running.values()) and (saved.host, saved.port_base) != (settings.host, settings.port_base):
        raise StackError("the stack runs with other settings; stop it first (make stack-stop)")
    todo = [s for s in all_services if running[s.name] is None]
    if not todo:
        print(f"the stack is already running in {settings.path()} (pids "
              f"{', '.join(f'{n} {p}' for n, p in running.items())}); nothing to do")
        return
    bin_dir()          # what it needs is installed, before anything starts
    weed_binary()
    end_leftovers(todo)
    check_ports(todo)
    settings.path().mkdir(parents=True, exist_ok=True)
    if not complete:
        save_secrets(secrets_dir, secrets)
    settings.save()
    write_pgpass(secrets_dir, settings.host, settings.port("postgres"), secrets)
    started: list[Service] = []
    for service in all_services:
        if running[service.name] is not None:
            print(f"{service.name:9s} already running (pid {running[service.name]}) on {service.address()}")
            continue
        try:
            pid = service.start()
        except BaseException:
            for done in reversed(started):   # all or nothing: what this call started stops again
                done.stop()
            raise
        started.append(service)
        print(f"{service.name:9s} started (pid {pid}) on {service.address()}", flush=True)
    env_file = client_env.write_env_file(settings, secrets)
    print(f"clients: source {env_file}   (credentials inside, mode 0600)")


def stop(settings: StackSettings) -> None:
    for service in reversed(services(settings)):
        pid, stray = service.pid(), service.leftovers()
        stopped = service.stop()
        what = (f"stopped (pid {pid})" if pid is not None else
                f"ended leftovers (pids {', '.join(map(str, stray))})" if stopped else "not running")
        print(f"{service.name:9s} {what}", flush=True)


def status(settings: StackSettings) -> int:
    """One line per service; a leader gone with members of its group still running (and maybe
    holding its port) is ``LEFTOVER``, which ``stop`` and the next ``start`` end."""
    healthy = True
    for service in services(settings):
        pid = service.pid()
        health = service.health() if pid is not None else None
        healthy &= bool(health and health.ok)
        stray = service.leftovers() if pid is None else []
        if stray:
            ports = service.leftover_ports()
            state = "LEFTOVER"
            detail = (f"crashed: pids {', '.join(map(str, stray))} of its process group still run"
                      + (f", listening on {', '.join(map(str, ports))}" if ports else "")
                      + "; make stack-stop or make stack ends them")
        else:
            state = "down" if pid is None else ("ok" if health and health.ok else "FAILING")
            detail = health.detail if health else "not running"
        print(f"{service.name:9s} {state:8s} pid {pid or '-':>7}  {service.address():22s} {detail}")
    return 0 if healthy else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.stack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["start", "stop", "status", "remote", "push", "pull"])
    parser.add_argument("--dir", type=Path, help="the stack's folder (STACK_DIR; default .stack)")
    parser.add_argument("--host", help="the address every service binds (STACK_HOST; default 127.0.0.1)")
    parser.add_argument("--port-base", type=int, help="first of the stack's ports (STACK_PORT_BASE; default 54300)")
    parser.add_argument("--allowed-hosts", help="comma-separated host names clients may use for MLflow")
    args = parser.parse_args(argv)
    try:
        if args.command == "remote":
            print(remote.configure_remote(Path.cwd()))
            return 0
        if args.command in ("push", "pull"):
            remote.transfer(Path.cwd(), args.command)
            return 0
        hosts = None if args.allowed_hosts is None else tuple(h for h in args.allowed_hosts.split(",") if h)
        settings = load(args.dir, args.host, args.port_base, hosts)
        if args.command != "start" and not settings.path("secrets").is_dir():
            print(f"no stack in {settings.path()}: start one with make stack")
            return 0 if args.command == "stop" else 1
        if args.command == "start":
            start(settings)
            if (Path.cwd() / ".dvc").is_dir():
                os.environ.update(client_env.client_variables(settings, services(settings)[0].secrets))
                print(remote.configure_remote(Path.cwd()))
        elif args.command == "stop":
            stop(settings)
        else:
            return status(settings)
    except (StackError, SettingsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
