"""LangGraph's side of scripts/bench-side-by-side.

The same workload as `keel-bench side-by-side`, written the way a Python team
would write it with LangGraph: a hand-written StateGraph over MessagesState
with an `agent` node (ChatOpenAI with the tool bound) and a prebuilt ToolNode,
routed by `tools_condition`, compiled with the durable AsyncSqliteSaver on a
file. Each session is a `thread_id`; a turn is one `ainvoke` with a user
message. The server answers the user message with a call of `bench__lookup`,
the ToolNode runs the tool (an async Python function, in this process, as
keel's in-process tool runs in keel's), and the server answers the tool
result with text: two model round trips per turn, as on keel's side.

Commands, each printing one JSON object on stdout:

  turns    N threads, one warm-up turn each, then T timed turns in every
           thread at once (asyncio.gather)
  prepare  N threads with one finished turn each, then a turn started in every
           thread against a server that never answers; prints once every
           thread's model request has been issued, then waits to be killed
  recover  opens the checkpointer in a fresh process and loads the latest
           state of every thread (`graph.aget_state`), the documented way to
           see where a thread stopped and resume it

Time inside provider HTTP calls is measured by a wrapping httpx transport,
from the moment a request is handed to the transport until its response body
has been read to the end, and attributed to the turn through a context
variable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import statistics
import sys
import time
from typing import Any

import openai
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
# The httpx flavour the installed openai SDK is built on (httpx2 for
# openai>=3), which langchain-openai exports for objects handed to the SDK.
from langchain_openai._compat import httpx
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

# The same system prompt keel's side sends.
INSTRUCTIONS = "You are a weather assistant. Use the lookup tool, then answer in one sentence."

# Per turn: a list that collects the seconds spent in each provider request.
PROVIDER_TIME: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("provider_time", default=None)
# Per turn in `prepare`: set once the turn's model request is issued.
REQUEST_ISSUED: contextvars.ContextVar[asyncio.Event | None] = contextvars.ContextVar("request_issued", default=None)


@tool("bench__lookup")
async def lookup(city: str) -> str:
    """Looks up today's weather for a city."""
    return json.dumps({"city": city, "forecast": "sunny", "temp_c": 21}, separators=(",", ":"))


class TimedStream(httpx.AsyncByteStream):
    """A response body that records when it has been read to the end."""

    def __init__(self, inner: Any, started: float, sink: list[float] | None) -> None:
        self.inner = inner
        self.started = started
        self.sink = sink

    def _finish(self) -> None:
        if self.sink is not None:
            self.sink.append(time.perf_counter() - self.started)
            self.sink = None

    async def __aiter__(self):
        async for chunk in self.inner:
            yield chunk
        self._finish()

    async def aclose(self) -> None:
        self._finish()
        await self.inner.aclose()


class TimedTransport(httpx.AsyncBaseTransport):
    """httpx's own transport, with the time of each request measured."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        started = time.perf_counter()
        issued = REQUEST_ISSUED.get()
        if issued is not None:
            issued.set()
        response = await self.inner.handle_async_request(request)
        response.stream = TimedStream(response.stream, started, PROVIDER_TIME.get())
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def chat_model(base_url: str) -> ChatOpenAI:
    # The connection limits are the ones ChatOpenAI's own default client uses.
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    client = openai.DefaultAsyncHttpxClient(
        base_url=base_url,
        transport=TimedTransport(httpx.AsyncHTTPTransport(limits=limits)),
        timeout=httpx.Timeout(600.0),
    )
    return ChatOpenAI(
        model="bench",
        base_url=base_url,
        api_key="not-needed",
        streaming=True,
        max_retries=2,
        http_async_client=client,
    )


def build_graph(base_url: str, checkpointer: AsyncSqliteSaver):
    model = chat_model(base_url).bind_tools([lookup])

    async def agent(state: MessagesState) -> dict[str, Any]:
        reply = await model.ainvoke([SystemMessage(INSTRUCTIONS), *state["messages"]])
        return {"messages": [reply]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([lookup]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def thread(n: int) -> dict[str, Any]:
    return {"configurable": {"thread_id": f"s-{n}"}}


async def one_turn(graph, n: int, text: str, durability: str) -> tuple[float, float]:
    """Runs one turn; returns its wall time and the time inside provider calls."""
    spent: list[float] = []
    token = PROVIDER_TIME.set(spent)
    try:
        clock = time.perf_counter()
        result = await graph.ainvoke({"messages": [HumanMessage(text)]}, thread(n), durability=durability)
        wall = time.perf_counter() - clock
    finally:
        PROVIDER_TIME.reset(token)
    last = result["messages"][-1]
    if last.type != "ai" or last.tool_calls or len(spent) != 2:
        raise RuntimeError(f"thread s-{n}: the turn did not end in a text answer after two model calls: {last!r}")
    return wall, sum(spent)


async def drive(graph, sessions: range, turns: int, durability: str) -> list[tuple[float, float]]:
    async def session(n: int) -> list[tuple[float, float]]:
        return [await one_turn(graph, n, "What's the weather in Paris?", durability) for _ in range(turns)]

    per_session = await asyncio.gather(*(session(n) for n in sessions))
    return [timing for timings in per_session for timing in timings]


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def pick(percent: float) -> float:
        # The same rank rule as keel-bench's percentile(): nearest rank,
        # halves rounded up.
        rank = int(percent / 100 * (len(ordered) - 1) + 0.5)
        return ordered[min(rank, len(ordered) - 1)]

    return {"p50": round(pick(50), 3), "p99": round(pick(99), 3), "mean": round(statistics.fmean(ordered), 3)}


async def synchronous_mode(saver: AsyncSqliteSaver) -> str:
    async with saver.conn.execute("PRAGMA synchronous") as cursor:
        row = await cursor.fetchone()
    return {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(row[0], str(row[0]))


async def turns_command(args: argparse.Namespace) -> dict[str, Any]:
    async with AsyncSqliteSaver.from_conn_string(args.db) as saver:
        graph = build_graph(args.provider_url, saver)
        await drive(graph, range(args.sessions), 1, args.durability)
        clock = time.perf_counter()
        timings = await drive(graph, range(args.sessions), args.turns, args.durability)
        elapsed = time.perf_counter() - clock
        synchronous = await synchronous_mode(saver)
    walls = [wall * 1000 for wall, _ in timings]
    overheads = [(wall - provider) * 1000 for wall, provider in timings]
    provider_total = sum(provider for _, provider in timings) * 1000
    done = len(timings)
    overhead = quantiles(overheads)
    if args.sessions > 1:
        # Reported like keel's side, which can only give the mean under load.
        overhead = {"p50": None, "p99": None, "mean": overhead["mean"], "p50_measured": overhead["p50"], "p99_measured": overhead["p99"]}
    return {
        "side": "langgraph",
        "sessions": args.sessions,
        "turns": done,
        "warmup_turns": args.sessions,
        "seconds": round(elapsed, 3),
        "turns_per_second": round(done / elapsed, 3),
        "turn_ms": quantiles(walls),
        "overhead_ms_per_turn": overhead,
        "provider_ms_per_turn": round(provider_total / done, 3),
        "synchronous": synchronous,
        "durability": args.durability,
    }


async def prepare_command(args: argparse.Namespace) -> None:
    clock = time.perf_counter()
    async with AsyncSqliteSaver.from_conn_string(args.db) as saver:
        graph = build_graph(args.provider_url, saver)
        for start in range(0, args.sessions, 1000):
            await drive(graph, range(start, min(start + 1000, args.sessions)), 1, args.durability)
        history_seconds = time.perf_counter() - clock
        hanging = build_graph(args.hang_url, saver)
        issued = [asyncio.Event() for _ in range(args.sessions)]

        async def start(n: int) -> None:
            REQUEST_ISSUED.set(issued[n])
            await hanging.ainvoke({"messages": [HumanMessage("And in Lyon?")]}, thread(n), durability=args.durability)

        turns = [asyncio.create_task(start(n)) for n in range(args.sessions)]
        for event in issued:
            await event.wait()
        print(json.dumps({"side": "langgraph", "ready": True, "sessions": args.sessions, "history_seconds": round(history_seconds, 3)}), flush=True)
        # Killed here by the script, every turn in flight.
        await asyncio.gather(*turns)


async def recover_command(args: argparse.Namespace) -> dict[str, Any]:
    clock = time.perf_counter()
    async with AsyncSqliteSaver.from_conn_string(args.db) as saver:
        graph = build_graph(args.provider_url, saver)
        loaded = recoverable = 0
        for n in range(args.sessions):
            state = await graph.aget_state(thread(n))
            if state.values.get("messages"):
                loaded += 1
            if state.next:
                recoverable += 1
        seconds = time.perf_counter() - clock
    return {"side": "langgraph", "sessions": loaded, "recoverable_turns": recoverable, "seconds": round(seconds, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("turns", "prepare", "recover"):
        command = commands.add_parser(name)
        command.add_argument("--provider-url", required=True, help="the server's API root, such as http://127.0.0.1:41234/v1")
        command.add_argument("--db", required=True, help="the checkpointer's SQLite file")
        command.add_argument("--durability", choices=["sync", "async", "exit"], default="sync")
        default_sessions = {"turns": 1000, "prepare": 10_000, "recover": 10_000}[name]
        command.add_argument("--sessions", type=int, default=default_sessions)
        if name == "turns":
            command.add_argument("--turns", type=int, default=3, help="timed turns per thread, after one warm-up turn each")
        if name == "prepare":
            command.add_argument("--hang-url", required=True, help="a server that holds every request open")
    args = parser.parse_args()
    if args.command == "turns":
        report = asyncio.run(turns_command(args))
    elif args.command == "prepare":
        asyncio.run(prepare_command(args))
        return
    else:
        report = asyncio.run(recover_command(args))
    json.dump(report, sys.stdout)
    print()


if __name__ == "__main__":
    main()
