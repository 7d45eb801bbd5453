//! Stream and event synchronization for the race checker: `cuEventRecord`,
//! `cuStreamWaitEvent`, `cuStreamSynchronize`, `cuEventSynchronize`, `cuCtxSynchronize` and
//! their runtime equivalents. A call that succeeded is passed on as a [`SyncOp`] (whether or not
//! the dump is being written: the checker has its own switch); nothing is written to the dump.

use libc::c_void;

use msmemscope_core::sanitizer::SyncOp;

use super::hook::cuda_hook;
use super::{CuResult, Layer, RuntimeCall, CUDA_ERROR_NOT_INITIALIZED};

fn sync(rc: CuResult, op: SyncOp) {
    if rc == 0 {
        crate::sanitizer::on_sync(op);
    }
}

/// Defines a driver/runtime pair of one synchronization call.
macro_rules! sync_pair {
    (
        $driver_hook:ident: $driver_ty:ident = $driver:ident / $driver_inst:ident,
        $runtime_hook:ident: $runtime_ty:ident = $runtime:ident / $runtime_inst:ident,
        ($($arg:ident : $ty:ty),*) => $op:expr
    ) => {
        cuda_hook! {
            #[doc = concat!("`", stringify!($driver), "`, passed to the race checker.")]
            $driver_hook: $driver_ty = $driver / $driver_inst, Layer::Driver,
            ($($arg: $ty),*) -> CuResult, missing = CUDA_ERROR_NOT_INITIALIZED,
            |real| {
                // SAFETY: the caller's arguments, passed on unchanged to the real driver function
                // under its contract, which our caller upholds.
                let rc = unsafe { real($($arg),*) };
                // Inside a runtime call the runtime hook reports it.
                if !RuntimeCall::active() {
                    sync(rc, $op);
                }
                rc
            }
        }

        cuda_hook! {
            #[doc = concat!("`", stringify!($runtime), "`, passed to the race checker.")]
            $runtime_hook: $runtime_ty = $runtime / $runtime_inst, Layer::Runtime,
            ($($arg: $ty),*) -> CuResult, missing = CUDA_ERROR_NOT_INITIALIZED,
            |real| {
                let rc = {
                    let _nested = RuntimeCall::enter();
                    // SAFETY: the caller's arguments, passed on unchanged to the real runtime
                    // function under its contract, which our caller upholds.
                    unsafe { real($($arg),*) }
                };
                sync(rc, $op);
                rc
            }
        }
    };
}

sync_pair! {
    EVENT_RECORD: EventRecordFn = cuEventRecord / event_record,
    CUDA_EVENT_RECORD: CudaEventRecordFn = cudaEventRecord / cuda_event_record,
    (event: *mut c_void, stream: *mut c_void) => SyncOp::EventRecord {
        event: event as u64,
        stream: stream as u64,
    }
}

sync_pair! {
    STREAM_WAIT_EVENT: StreamWaitEventFn = cuStreamWaitEvent / stream_wait_event,
    CUDA_STREAM_WAIT_EVENT: CudaStreamWaitEventFn = cudaStreamWaitEvent / cuda_stream_wait_event,
    (stream: *mut c_void, event: *mut c_void, flags: u32) => SyncOp::StreamWaitEvent {
        stream: stream as u64,
        event: event as u64,
    }
}

sync_pair! {
    STREAM_SYNCHRONIZE: StreamSynchronizeFn = cuStreamSynchronize / stream_synchronize,
    CUDA_STREAM_SYNCHRONIZE: CudaStreamSynchronizeFn = cudaStreamSynchronize / cuda_stream_synchronize,
    (stream: *mut c_void) => SyncOp::StreamSynchronize { stream: stream as u64 }
}

sync_pair! {
    EVENT_SYNCHRONIZE: EventSynchronizeFn = cuEventSynchronize / event_synchronize,
    CUDA_EVENT_SYNCHRONIZE: CudaEventSynchronizeFn = cudaEventSynchronize / cuda_event_synchronize,
    (event: *mut c_void) => SyncOp::EventSynchronize { event: event as u64 }
}

sync_pair! {
    CTX_SYNCHRONIZE: CtxSynchronizeFn = cuCtxSynchronize / ctx_synchronize,
    CUDA_DEVICE_SYNCHRONIZE: CudaDeviceSynchronizeFn = cudaDeviceSynchronize / cuda_device_synchronize,
    () => SyncOp::DeviceSynchronize
}
