"""agent.trace.text: canned ``trace`` text for every event type and marker (the binary
reader is checked against the captured text in tests/test_trace_pages.py)."""

from __future__ import annotations

from agent.trace.text import TextStats, parse_text
from tests.eventpages import load_formats

FMTS = load_formats()
BY_ID = {f.id: f for f in FMTS.values()}


# --- text --------------------------------------------------------------------------------------

CANNED = """\
# tracer: nop
#
# entries-in-buffer/entries-written: 20/25   #P:2
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
##### CPU 1 buffer started ####
   my probe thr-4242    [001] d..2.  100.000010: sched_switch: prev_comm=my probe thr prev_pid=4242 prev_prio=120 prev_state=R+ ==> next_comm=kworker/1:0-mm_percpu_wq next_pid=45 next_prio=120
 kworker/1:0-mm_percpu_wq-45 [001] .....  100.000011: workqueue_execute_start: work struct 00000000c0ffee00: function vmstat_update
 kworker/1:0-mm_percpu_wq-45 [001] .....  100.001211: workqueue_execute_end: work struct 00000000c0ffee00: function vmstat_update
 kworker/1:0-mm_percpu_wq-45 [001] dN.4.  100.001212: sched_waking: comm=my probe thr pid=4242 prio=120 target_cpu=001
 kworker/1:0-mm_percpu_wq-45 [001] dN.5.  100.001213: sched_wakeup: comm=my probe thr pid=4242 prio=120 target_cpu=001
          <idle>-0       [001] d.h1.  100.002000: irq_handler_entry: irq=24 name=virtio0-input.0
          <idle>-0       [001] d.h1.  100.002004: irq_handler_exit: irq=24 ret=handled
          <idle>-0       [001] ..s1.  100.002005: softirq_entry: vec=3 [action=NET_RX]
          <idle>-0       [001] ..s1.  100.002405: softirq_exit: vec=3 [action=NET_RX]
          <idle>-0       [001] d.h1.  100.003000: local_timer_entry: vector=236
          <idle>-0       [001] d.h1.  100.003009: local_timer_exit: vector=236
          <idle>-0       [001] d.h1.  100.003100: call_function_entry: vector=251
          <idle>-0       [001] d.h1.  100.003101: tlb_flush: pages:-1 reason:remote shootdown (1)
          <idle>-0       [001] d.h1.  100.003120: call_function_exit: vector=251
CPU:1 [LOST 17 EVENTS]
          <idle>-0       [001] d..2.  100.003200: sched_migrate_task: comm=my probe thr pid=4242 prio=120 orig_cpu=0 dest_cpu=1
          <idle>-0       [001] d..3.  100.003300: ipi_send_cpu: cpu=0 callsite=ttwu_queue_wakelist+0x11d/0x150 callback=generic_smp_call_function_single_interrupt+0x0/0x10
          <idle>-0       [001] d..3.  100.003301: ipi_send_cpumask: cpumask=0-1 callsite=on_each_cpu_cond_mask+0x24/0x40 callback=flush_tlb_func+0x0/0x230
          <idle>-0       [001] d..3.  100.003302: sched_wakeup_new: comm=bash pid=77 prio=120 target_cpu=001
          <idle>-0       [001] d..3.  100.003303: some_new_event: foo=1 bar=baz
          <idle>-0       [001] d..2.  100.003310: sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_c
          <idle>-0       [001] d..2.  100.003000: local_timer_entry: vector=236
          <idle>-0  (    0) [001] d..2.  100.004000: local_timer_entry: vector=236
          <idle>-0       [001]  100.004100: local_timer_exit: vector=236
   garbage line without a timestamp
"""


def test_canned_text_every_event_type_and_marker():
    known = {"sched_switch", "workqueue_execute_start", "workqueue_execute_end",
             "sched_waking", "sched_wakeup", "irq_handler_entry", "irq_handler_exit",
             "softirq_entry", "softirq_exit", "local_timer_entry", "local_timer_exit",
             "call_function_entry", "call_function_exit", "tlb_flush", "sched_migrate_task",
             "ipi_send_cpu", "ipi_send_cpumask", "sched_wakeup_new"}
    stats = TextStats()
    evs = parse_text(CANNED.splitlines(), known, stats=stats)
    by = {}
    for e in evs:
        by.setdefault(e.name, e)
    sw = by["sched_switch"]
    assert sw.pid == 4242 and sw.ts_ns == 100_000_010_000
    assert sw.fields["prev_comm"] == "my probe thr" and sw.fields["prev_state"] == "R+"
    assert sw.fields["next_comm"] == "kworker/1:0-mm_percpu_wq" and sw.fields["next_pid"] == 45
    assert by["workqueue_execute_start"].pid == 45
    assert by["workqueue_execute_start"].fields == {"function": "vmstat_update"}
    # (irq_ctx: the flags column's third character, "." = task context)
    assert by["sched_waking"].fields == {"comm": "my probe thr", "pid": 4242, "prio": 120,
                                         "target_cpu": 1, "irq_ctx": ""}
    assert by["irq_handler_entry"].fields == {"irq": 24, "name": "virtio0-input.0"}
    assert by["softirq_entry"].fields == {"vec": 3, "action": "NET_RX"}
    assert by["local_timer_entry"].fields == {"vector": 236}
    assert by["tlb_flush"].fields == {"pages": -1, "reason_str": "remote shootdown", "reason": 1}
    assert by["sched_migrate_task"].fields["dest_cpu"] == 1
    assert by["ipi_send_cpu"].fields["callback"] == "generic_smp_call_function_single_interrupt"
    assert by["ipi_send_cpumask"].fields["callback"] == "flush_tlb_func"
    assert by["sched_wakeup_new"].fields["pid"] == 77
    # markers and edges
    assert stats.lost == {1: 17}
    assert stats.started == {1: 100_000_010_000}
    assert stats.unknown == 1  # some_new_event
    assert stats.bad_lines == 2  # the truncated sched_switch, the garbage line
    assert stats.backwards == 1  # 100.003000 after 100.003310 on CPU 1
    # the record-tgid column and a line without the flags column still parse
    tail = [e for e in evs if e.ts_ns >= 100_004_000_000]
    assert [(e.name, e.ts_ns) for e in tail] == [("local_timer_entry", 100_004_000_000),
                                                 ("local_timer_exit", 100_004_100_000)]


def test_text_time_window_and_unknown_events_kept_when_no_filter():
    evs = parse_text(CANNED.splitlines(), t_from=100_002_000_000, t_to=100_002_405_000)
    assert [e.name for e in evs] == ["irq_handler_entry", "irq_handler_exit", "softirq_entry",
                                     "softirq_exit"]
    every = parse_text(CANNED.splitlines())
    assert any(e.name == "some_new_event" and e.fields == {"foo": "1", "bar": "baz"}
               for e in every)


def test_text_parser_never_raises_on_cut_lines():
    lines = CANNED.splitlines()
    for line in lines:
        for cut in range(0, len(line), 7):
            parse_text([line[:cut]])
