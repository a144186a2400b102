"""SSD's draft process prefills a prompt a chunk at a time between the leader's messages (engine.draft_prefill).

The leader's one-way messages (START, FINISH) wait for the draft process to take the one before (a mailbox holds
one). When the draft process prefilled a whole prompt before it read its next message, a request that ended during
a long prompt's draft prefill (compare's one-token warm-up; a cancel) held up the next request's START, and with it
the next reply's first token, for the rest of that prefill: 13.8 s against AR's 0.8 s on an 8k-token prompt. Here
the real server loop (engine.draft_server._Server) runs against a scripted channel and a recording draft.
"""

from __future__ import annotations

from engine.draft_server import FINISH, SHUTDOWN, START, STATS, _Server, encode_start
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
CHUNK = 7
LONG = list(range(5, 105))    # 100 tokens: 15 chunks
OTHER = list(range(200, 230))  # 30 tokens: 5 chunks
IDLE = None                    # a message the leader sends only once the draft process waits for it


class Blocks:
    num_free_blocks, blocks = 10, list(range(10))


class RecordingDraft:
    """The draft side of the server: logs each prefill forward (request -> tokens prefilled after it) and each
    finished request."""

    def __init__(self, log: list):
        self.log, self.blocks, self.seqs = log, Blocks(), {}

    def start(self, seqs, *, upto):
        self.log.append(("chunk", {seq.seq_id: upto[seq] for seq in seqs}))
        self.seqs |= {seq.seq_id: seq for seq in seqs}
        return {seq: 0 for seq in seqs if upto[seq] == len(seq.token_ids)}

    def finish(self, seq):
        self.log.append(("finish", seq.seq_id))
        self.seqs.pop(seq.seq_id, None)


class ScriptedChannel:
    """The leader's messages, each sent once the draft has run a given number of prefill forwards (IDLE: once it
    waits for one)."""

    def __init__(self, log: list, script: list[tuple[int | None, list[int]]]):
        self.log, self.script, self.replies = log, list(script), []

    def _forwards(self) -> int:
        return sum(kind == "chunk" for kind, _ in self.log)

    def poll(self) -> bool:
        after = self.script[0][0]
        return after is not None and self._forwards() >= after

    def recv_ints(self) -> list[int]:
        after, msg = self.script.pop(0)
        assert after is IDLE or self._forwards() >= after, "read before it was sent"
        self.log.append(("read", msg[0]))
        return msg

    def send_ints(self, values: list[int]) -> None:
        self.replies.append(values)


def _start(seq_id: int, prompt: list[int]) -> list[int]:
    return [START, 1, *encode_start(Sequence(seq_id, prompt, GREEDY), draft_seed=0)]


def _serve(script) -> tuple[list, ScriptedChannel]:
    log: list = []
    channel = ScriptedChannel(log, script)
    _Server(RecordingDraft(log), channel, prefill_chunk=CHUNK).loop()
    return log, channel


def _chunks_of(log: list, seq_id: int) -> list[int]:
    return [ends[seq_id] for kind, ends in log if kind == "chunk" and seq_id in ends]


def test_a_message_is_read_after_the_chunk_under_way_not_after_the_whole_prompt():
    log, _ = _serve([(IDLE, _start(1, LONG)), (1, [FINISH, 1, 1]), (2, _start(2, OTHER)), (IDLE, [SHUTDOWN])])
    reads = [i for i, (kind, _) in enumerate(log) if kind == "read"]
    assert log[reads[1]] == ("read", FINISH) and reads[1] == reads[0] + 2  # START, one forward, FINISH
    # the finished request's prompt went on while nothing else came, and stopped at the next START
    assert _chunks_of(log, 1) == [7, 14]
    assert log[reads[2]:reads[2] + 2] == [("read", START), ("finish", 1)]
    assert _chunks_of(log, 2) == [7, 14, 21, 28, 30]  # the new prompt from its start, in the target's chunks
    assert log[-1] == ("read", SHUTDOWN)


def test_an_orphaned_prompt_prefills_to_its_end_while_idle_then_is_freed():
    """So that it lands in the draft's prefix cache, as compare's one-token warm-up means it to."""
    log, channel = _serve([(IDLE, _start(1, LONG)), (1, [FINISH, 1, 1]), (IDLE, [STATS]), (IDLE, [SHUTDOWN])])
    assert _chunks_of(log, 1) == [*range(7, 100, 7), 100]
    assert log[-3:] == [("finish", 1), ("read", STATS), ("read", SHUTDOWN)]
    assert channel.replies[0] == [10, 10, 0]  # nothing live


def test_stats_stops_an_orphan_and_finishes_live_prompts_first():
    log, channel = _serve([(IDLE, [START, 2, *encode_start(Sequence(1, LONG, GREEDY), 0),
                                   *encode_start(Sequence(2, OTHER, GREEDY), 0)]),
                           (1, [FINISH, 1, 1]), (2, [STATS]), (IDLE, [SHUTDOWN])])
    assert _chunks_of(log, 1) == [7, 14]
    assert ("finish", 1) in log and log.index(("finish", 1)) < len(log) - 2
    assert _chunks_of(log, 2)[-1] == len(OTHER)  # the live prompt, whole before STATS answered
    assert channel.replies[0][2] == 1
