//! The stream-race sanitizer's pure part: the `sanitizer-op:` mark format
//! (docs/analyses.md#sanitizer) and the vector-clock race checker fed by those marks and by the
//! stream/event synchronization calls the runtime intercepts.

pub mod message;
pub mod race;
pub mod report;

/// A synchronization between streams, as the CUDA stream/event API expresses it. Handles are the
/// API's opaque pointers as integers; stream 0 is the legacy default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOp {
    /// `cudaEventRecord(event, stream)`: the event captures the stream's current work.
    EventRecord { event: u64, stream: u64 },
    /// `cudaStreamWaitEvent(stream, event)`: later work on `stream` waits for the recorded work.
    StreamWaitEvent { stream: u64, event: u64 },
    /// `cudaEventSynchronize(event)`: the host waits for the recorded work.
    EventSynchronize { event: u64 },
    /// `cudaStreamSynchronize(stream)`: the host waits for all work on `stream`.
    StreamSynchronize { stream: u64 },
    /// `cudaDeviceSynchronize()`: the host waits for all work on every stream.
    DeviceSynchronize,
}
