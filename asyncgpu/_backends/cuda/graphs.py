"""CUDA graphs: stream capture, the event-record nodes of a captured graph, replays."""

from __future__ import annotations

from typing import Any

from asyncgpu._backends.cuda.hotpath import CudaDeviceBase
from asyncgpu._base.errors import BackendError


class GraphsMixin(CudaDeviceBase):
    """`CudaDevice`'s graphs (`asyncgpu._runtime.graph`)."""

    # A raw graph is ``(CUgraph, CUgraphExec)``: the template stays alive because its nodes name the nodes of
    # the executable graph (``cuGraphExecEventRecordNodeSetEvent`` takes a template node).
    def _capture_error(self, err: Any, call: str) -> BackendError:
        return BackendError(
            f"{call} failed: {getattr(err, 'name', err)}. The capture was invalidated or misused: inside "
            "`with stream.capture()` launch only on the captured stream, and do not synchronize, wait on the "
            "host or allocate outside the stream (CUDA forbids such calls in the capturing thread)"
        )

    def begin_capture(self, raw_stream: Any) -> None:
        d = self._drv.d
        self.make_current()
        err = d.cuStreamBeginCapture(raw_stream[1], d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)[0]
        if err is not self._drv.SUCCESS:
            raise self._capture_error(err, "cuStreamBeginCapture")

    def record_in_capture(self, raw_event: Any, raw_stream: Any) -> None:
        d = self._drv.d
        external = d.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL  # a node of the graph, not a capture-internal join
        err = d.cuEventRecordWithFlags(raw_event[1], raw_stream[1], external)[0]
        if err is not self._drv.SUCCESS:
            raise self._capture_error(err, "cuEventRecordWithFlags(CU_EVENT_RECORD_EXTERNAL)")

    def end_capture(self, raw_stream: Any) -> tuple:
        d = self._drv.d
        err, graph = d.cuStreamEndCapture(raw_stream[1])
        if err is not self._drv.SUCCESS:
            raise self._capture_error(err, "cuStreamEndCapture")
        err, exe = d.cuGraphInstantiate(graph, 0)
        if err is not self._drv.SUCCESS:
            d.cuGraphDestroy(graph)
            raise self._drv.error(err, "cuGraphInstantiate")
        return (graph, exe)

    def abort_capture(self, raw_stream: Any) -> None:
        err, graph = self._drv.d.cuStreamEndCapture(raw_stream[1])  # an error means there is nothing to free
        if err is self._drv.SUCCESS and int(graph):
            self._drv.d.cuGraphDestroy(graph)

    def graph_event_nodes(self, raw_graph: Any, raw_events: list) -> list:
        d = self._drv.d
        graph = raw_graph[0]
        room = 2 * len(raw_events) + 16
        while True:  # never pass numNodes=0 (a NULL array): ask for room until some is left over
            err, nodes, count = d.cuGraphGetNodes(graph, room)
            if err is not self._drv.SUCCESS:
                raise self._drv.error(err, "cuGraphGetNodes")
            if count < room:
                break
            room *= 2
        record_type = d.CUgraphNodeType.CU_GRAPH_NODE_TYPE_EVENT_RECORD
        by_event = {}
        for node in nodes[:count]:
            err, node_type = d.cuGraphNodeGetType(node)
            if err is not self._drv.SUCCESS:
                raise self._drv.error(err, "cuGraphNodeGetType")
            if node_type == record_type:
                err, event = d.cuGraphEventRecordNodeGetEvent(node)
                if err is not self._drv.SUCCESS:
                    raise self._drv.error(err, "cuGraphEventRecordNodeGetEvent")
                by_event[int(event)] = node
        missing = sum(raw[2] not in by_event for raw in raw_events)
        if missing:
            raise BackendError(
                f"{missing} of {len(raw_events)} timing events left no event-record node in the "
                "captured graph: this driver ignores CU_EVENT_RECORD_EXTERNAL; update the driver"
            )
        return [by_event[raw[2]] for raw in raw_events]

    def set_graph_events(self, raw_graph: Any, nodes: list, raw_events: list) -> None:
        d, exe = self._drv.d, raw_graph[1]
        for node, raw in zip(nodes, raw_events):
            err = d.cuGraphExecEventRecordNodeSetEvent(exe, node, raw[1])[0]
            if err is not self._drv.SUCCESS:
                raise self._drv.error(err, "cuGraphExecEventRecordNodeSetEvent")

    def launch_graph(self, raw_graph: Any, raw_stream: Any) -> None:
        err = self._drv.d.cuGraphLaunch(raw_graph[1], raw_stream[1])[0]
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuGraphLaunch")

    def destroy_graph(self, raw_graph: Any) -> None:
        d = self._drv.d
        err = d.cuGraphExecDestroy(raw_graph[1])[0]
        d.cuGraphDestroy(raw_graph[0])
        if err is not self._drv.SUCCESS:
            raise self._drv.error(err, "cuGraphExecDestroy")
