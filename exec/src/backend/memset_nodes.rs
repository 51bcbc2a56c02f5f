//! Memset nodes of a captured graph as kernel nodes.
//!
//! A library may enqueue a memset between its kernels (cuBLASLt zeroes 4 bytes of its
//! workspace before some of its Hopper GEMMs). Captured, that is a memset node between two
//! kernel nodes, and a replay pays for the change of node type: on an H200 the memset started
//! 1.3 µs after the kernel before it ended, and the kernel after it 3.1–4.4 µs after the memset
//! ended, where one kernel node follows another with no gap. Before a captured graph is
//! instantiated, each plain memset node (one row of 1-, 2- or 4-byte elements, plain edges) is
//! replaced by a node of a kernel that stores the same value over the same elements, with the
//! same dependencies: the work and its order are the same, only the node's type changes.
//! Memsets of more than 4 MiB stay: there the memset's own wide stores matter more than the
//! latency around it.
//!
//! The kernel is PTX written here, compiled by the driver when first needed (no NVRTC in
//! `exec`).

use crate::error::{Result, check};
use cudarc::driver::CudaContext;
use cudarc::driver::sys::{self, CUfunction, CUgraph, CUgraphNode, CUmodule};
use std::ffi::c_void;
use std::ptr;
use std::sync::{Arc, Mutex};

/// Threads a block of the fill kernel.
const BLOCK: u32 = 256;
/// At most this many blocks; each thread loops over the elements beyond them.
const MAX_BLOCKS: u64 = 1024;
/// Memsets of more bytes stay memset nodes: there the copy engine's wide stores matter more
/// than the latency around the node (the kernel stores one element a thread at a time).
const MAX_BYTES: usize = 4 << 20;

/// One entry point per element width: `(dst, value, n)` stores the low bytes of `value` at
/// `dst[0..n]`, each thread every `gridDim × blockDim`-th element from its own.
fn ptx() -> String {
    let mut s = String::from(".version 6.0\n.target sm_50\n.address_size 64\n");
    for (bits, shift) in [(8, 0), (16, 1), (32, 2)] {
        // The stored register: the value itself for 32 bits, its low half for 8 and 16 (`st`
        // of 8 or 16 bits takes a 16-bit register).
        let (cvt, src) = if bits == 32 {
            (String::new(), "%r1")
        } else {
            ("\tcvt.u16.u32 %h1, %r1;\n".to_string(), "%h1")
        };
        s += &format!(
            "
.visible .entry frt_fill_b{bits}(
\t.param .u64 frt_fill_b{bits}_dst,
\t.param .u32 frt_fill_b{bits}_value,
\t.param .u64 frt_fill_b{bits}_n
)
{{
\t.reg .pred %p1;
\t.reg .b16 %h1;
\t.reg .b32 %r<6>;
\t.reg .b64 %rd<8>;
\tld.param.u64 %rd1, [frt_fill_b{bits}_dst];
\tld.param.u32 %r1, [frt_fill_b{bits}_value];
\tld.param.u64 %rd2, [frt_fill_b{bits}_n];
{cvt}\tcvta.to.global.u64 %rd3, %rd1;
\tmov.u32 %r2, %ctaid.x;
\tmov.u32 %r3, %ntid.x;
\tmov.u32 %r4, %tid.x;
\tmov.u32 %r5, %nctaid.x;
\tmul.wide.u32 %rd4, %r2, %r3;
\tcvt.u64.u32 %rd5, %r4;
\tadd.s64 %rd4, %rd4, %rd5;
\tmul.wide.u32 %rd6, %r5, %r3;
fill_b{bits}_loop:
\tsetp.ge.u64 %p1, %rd4, %rd2;
\t@%p1 bra fill_b{bits}_done;
\tshl.b64 %rd7, %rd4, {shift};
\tadd.s64 %rd7, %rd3, %rd7;
\tst.global.b{bits} [%rd7], {src};
\tadd.s64 %rd4, %rd4, %rd6;
\tbra.uni fill_b{bits}_loop;
fill_b{bits}_done:
\tret;
}}
"
        );
    }
    s + "\0"
}

/// The loaded fill kernels (unloaded with the last device handle).
struct FillKernels {
    cu: Arc<CudaContext>,
    module: CUmodule,
    /// For element sizes 1, 2 and 4.
    funcs: [CUfunction; 3],
}

// SAFETY: module and function handles belong to the context, not to a thread; the driver
// accepts them from any thread with the context current.
unsafe impl Send for FillKernels {}
unsafe impl Sync for FillKernels {}

impl Drop for FillKernels {
    fn drop(&mut self) {
        if self.cu.bind_to_thread().is_ok() {
            // SAFETY: the module was loaded by `load` and no graph made afterwards uses it
            // (graphs keep their device, and so this, alive).
            unsafe { sys::cuModuleUnload(self.module) };
        }
    }
}

/// What the device keeps for the rewrite: whether it runs, how many nodes it replaced, and
/// the kernels once loaded.
pub(crate) struct MemsetNodes {
    pub enabled: std::sync::atomic::AtomicBool,
    pub replaced: std::sync::atomic::AtomicUsize,
    /// Why the fill kernels could not be loaded (the rewrite then stays off).
    pub error: Mutex<Option<String>>,
    fill: Mutex<Option<Arc<FillKernels>>>,
    /// The kernels' PTX (`ptx`; another text in a test of a failed load).
    source: fn() -> String,
}

impl Default for MemsetNodes {
    fn default() -> Self {
        MemsetNodes {
            enabled: true.into(),
            replaced: 0.into(),
            error: Mutex::new(None),
            fill: Mutex::new(None),
            source: ptx,
        }
    }
}

fn load(cu: &Arc<CudaContext>, text: String) -> Result<FillKernels> {
    let mut module = ptr::null_mut();
    // SAFETY: the context is current (the caller bound it); `text` is NUL-terminated PTX.
    check("cuModuleLoadData", unsafe {
        sys::cuModuleLoadData(&mut module, text.as_ptr() as *const c_void)
    })?;
    let mut funcs = [ptr::null_mut(); 3];
    for (f, name) in funcs
        .iter_mut()
        .zip([c"frt_fill_b8", c"frt_fill_b16", c"frt_fill_b32"])
    {
        // SAFETY: `module` was just loaded; `name` is NUL-terminated; valid out pointer.
        let r = check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(f, module, name.as_ptr())
        });
        if let Err(e) = r {
            // SAFETY: nothing else knows `module`.
            unsafe { sys::cuModuleUnload(module) };
            return Err(e);
        }
    }
    Ok(FillKernels {
        cu: cu.clone(),
        module,
        funcs,
    })
}

/// `node`'s neighbours on one side (`dependents`: the nodes that depend on it; else those
/// it depends on), or `None` where an edge is not a plain one (a programmatic or port edge).
fn neighbours(node: CUgraphNode, dependents: bool) -> Result<Option<Vec<CUgraphNode>>> {
    let get = |nodes: *mut CUgraphNode, edges: *mut sys::CUgraphEdgeData, n: &mut usize| {
        // SAFETY: `node` is a live node; the arrays hold `*n` entries or are null (a count).
        unsafe {
            if dependents {
                sys::cuGraphNodeGetDependentNodes_v2(node, nodes, edges, n)
            } else {
                sys::cuGraphNodeGetDependencies_v2(node, nodes, edges, n)
            }
        }
    };
    let call = if dependents {
        "cuGraphNodeGetDependentNodes"
    } else {
        "cuGraphNodeGetDependencies"
    };
    let mut n = 0usize;
    check(call, get(ptr::null_mut(), ptr::null_mut(), &mut n))?;
    if n == 0 {
        return Ok(Some(Vec::new()));
    }
    let mut nodes = vec![ptr::null_mut(); n];
    // SAFETY: plain data; all zeros is the default edge.
    let mut edges = vec![unsafe { std::mem::zeroed::<sys::CUgraphEdgeData>() }; n];
    check(call, get(nodes.as_mut_ptr(), edges.as_mut_ptr(), &mut n))?;
    let plain = edges
        .iter()
        .all(|e| e.type_ == 0 && e.from_port == 0 && e.to_port == 0);
    Ok(plain.then_some(nodes))
}

impl MemsetNodes {
    fn kernels(&self, cu: &Arc<CudaContext>) -> Result<Arc<FillKernels>> {
        let mut fill = self.fill.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = fill.as_ref() {
            return Ok(f.clone());
        }
        let f = Arc::new(load(cu, (self.source)())?);
        *fill = Some(f.clone());
        Ok(f)
    }

    /// Replaces `graph`'s plain memset nodes (see the module docs); returns how many. The
    /// context is current.
    pub fn rewrite(&self, cu: &Arc<CudaContext>, graph: CUgraph) -> Result<usize> {
        let mut n = 0usize;
        // SAFETY: `graph` is a live graph; a null array asks for the count.
        check("cuGraphGetNodes", unsafe {
            sys::cuGraphGetNodes(graph, ptr::null_mut(), &mut n)
        })?;
        let mut nodes = vec![ptr::null_mut(); n];
        // SAFETY: `nodes` holds `n` entries.
        check("cuGraphGetNodes", unsafe {
            sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n)
        })?;
        nodes.truncate(n);
        let mut replaced = 0;
        for node in nodes {
            let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: `node` is a node of `graph`; valid out pointer.
            check("cuGraphNodeGetType", unsafe {
                sys::cuGraphNodeGetType(node, &mut kind)
            })?;
            if kind != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET {
                continue;
            }
            // SAFETY: plain data, filled in below.
            let mut p: sys::CUDA_MEMSET_NODE_PARAMS = unsafe { std::mem::zeroed() };
            // SAFETY: `node` is a memset node; valid out pointer.
            check("cuGraphMemsetNodeGetParams", unsafe {
                sys::cuGraphMemsetNodeGetParams(node, &mut p)
            })?;
            let which = match p.elementSize {
                1 => 0,
                2 => 1,
                4 => 2,
                _ => continue,
            };
            if p.height != 1 || p.width == 0 || p.width * p.elementSize as usize > MAX_BYTES {
                continue;
            }
            let (Some(before), Some(after)) = (neighbours(node, false)?, neighbours(node, true)?)
            else {
                continue;
            };
            let fill = match self.kernels(cu) {
                Ok(f) => f,
                // Without the kernels (a driver that cannot compile PTX) the memset nodes stay
                // as captured, this graph's and later ones': the same work, nothing modified
                // yet. `Ctx::memset_nodes_error` tells why.
                Err(e) => {
                    *self.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                    self.enabled
                        .store(false, std::sync::atomic::Ordering::Relaxed);
                    break;
                }
            };
            let (mut dst, mut value, mut count) = (p.dst, p.value, p.width as u64);
            let mut args = [
                &mut dst as *mut u64 as *mut c_void,
                &mut value as *mut u32 as *mut c_void,
                &mut count as *mut u64 as *mut c_void,
            ];
            let blocks = count.div_ceil(BLOCK as u64).min(MAX_BLOCKS) as u32;
            let params = sys::CUDA_KERNEL_NODE_PARAMS {
                func: fill.funcs[which],
                gridDimX: blocks,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: BLOCK,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                kernelParams: args.as_mut_ptr(),
                extra: ptr::null_mut(),
                kern: ptr::null_mut(),
                ctx: ptr::null_mut(),
            };
            let mut k = ptr::null_mut();
            // SAFETY: `before` are nodes of `graph`; the parameters are copied by the call.
            check("cuGraphAddKernelNode", unsafe {
                let deps = if before.is_empty() {
                    ptr::null()
                } else {
                    before.as_ptr()
                };
                sys::cuGraphAddKernelNode_v2(&mut k, graph, deps, before.len(), &params)
            })?;
            if !after.is_empty() {
                let from = vec![k; after.len()];
                // SAFETY: both arrays hold `after.len()` nodes of `graph`; null edge data is
                // the plain edge.
                check("cuGraphAddDependencies", unsafe {
                    sys::cuGraphAddDependencies_v2(
                        graph,
                        from.as_ptr(),
                        after.as_ptr(),
                        ptr::null(),
                        after.len(),
                    )
                })?;
            }
            // SAFETY: the memset node is replaced; its edges go with it.
            check("cuGraphDestroyNode", unsafe {
                sys::cuGraphDestroyNode(node)
            })?;
            replaced += 1;
        }
        self.replaced
            .fetch_add(replaced, std::sync::atomic::Ordering::Relaxed);
        Ok(replaced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::CudaDevice;
    use crate::ctx::Device;
    use std::collections::BTreeSet;

    fn ok(r: sys::CUresult) {
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    }

    fn kind(n: CUgraphNode) -> sys::CUgraphNodeType {
        let mut k = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: a live node; valid out pointer.
        ok(unsafe { sys::cuGraphNodeGetType(n, &mut k) });
        k
    }

    /// `ctx`'s device (bound), `bytes` of device memory and an empty graph.
    fn empty_graph(ctx: &crate::Ctx, bytes: usize) -> (&CudaDevice, u64, CUgraph) {
        let Device::Cuda(dev) = &ctx.inner.device else {
            unreachable!("a CUDA context")
        };
        dev.bind().unwrap();
        let mem = dev.alloc(bytes).unwrap();
        let mut g = ptr::null_mut();
        // SAFETY: valid out pointer; the context is current.
        ok(unsafe { sys::cuGraphCreate(&mut g, 0) });
        (dev, mem, g)
    }

    fn set(nodes: Vec<CUgraphNode>) -> BTreeSet<usize> {
        nodes.into_iter().map(|n| n as usize).collect()
    }

    /// Without its kernels (PTX the driver refuses) the rewrite leaves the graph as captured,
    /// says why, and stays off; the graph still runs its memset.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn a_failed_load_leaves_the_memset_nodes() {
        let ctx = crate::Ctx::cuda(0).expect("a CUDA GPU");
        let (dev, mem, g) = empty_graph(&ctx, 256);
        let p = sys::CUDA_MEMSET_NODE_PARAMS {
            dst: mem,
            pitch: 0,
            value: 0x0102_0304,
            elementSize: 4,
            width: 64,
            height: 1,
        };
        let mut m = ptr::null_mut();
        // SAFETY: the range is `mem`'s; no dependencies.
        ok(unsafe { sys::cuGraphAddMemsetNode(&mut m, g, ptr::null(), 0, &p, dev.cu.cu_ctx()) });
        let memsets = MemsetNodes {
            source: || ".version 6.0\n.target sm_50\nnot ptx\0".to_string(),
            ..MemsetNodes::default()
        };
        assert_eq!(memsets.rewrite(&dev.cu, g).unwrap(), 0);
        let error = memsets.error.lock().unwrap().clone();
        assert!(
            error
                .as_deref()
                .is_some_and(|e| e.contains("cuModuleLoadData")),
            "{error:?}"
        );
        assert!(!memsets.enabled.load(std::sync::atomic::Ordering::Relaxed));
        assert_eq!(kind(m), sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET);
        let s = dev.create_stream(0).unwrap();
        let mut exec = ptr::null_mut();
        let mut host = [0u32; 64];
        // SAFETY: `g` is a complete graph of this context; `host` holds 256 bytes, copied
        // after the replay; nothing is in flight when the handles go.
        unsafe {
            ok(sys::cuGraphInstantiateWithFlags(&mut exec, g, 0));
            ok(sys::cuGraphLaunch(exec, s));
            ok(sys::cuStreamSynchronize(s));
            ok(sys::cuMemcpyDtoH_v2(
                host.as_mut_ptr() as *mut c_void,
                mem,
                256,
            ));
            ok(sys::cuGraphExecDestroy(exec));
            ok(sys::cuGraphDestroy(g));
            dev.destroy_stream(s).unwrap();
            dev.free(mem).unwrap();
        }
        assert_eq!(host, [0x0102_0304; 64]);
    }

    /// The rewrite on a graph built by hand: each plain memset node is replaced by a kernel
    /// node with exactly the memset's dependencies and dependents (a join and a fork, a
    /// chain's end, a root), a 2-D memset and one of more than `MAX_BYTES` stay, and the
    /// instantiated graph stores the values.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn memset_nodes_keep_their_edges_and_values() {
        let ctx = crate::Ctx::cuda(0).expect("a CUDA GPU");
        let (dev, mem, g) = empty_graph(&ctx, 4096 + MAX_BYTES + 4);
        let empty = |deps: &[CUgraphNode]| {
            let mut n = ptr::null_mut();
            // SAFETY: `deps` are nodes of `g`.
            ok(unsafe { sys::cuGraphAddEmptyNode(&mut n, g, deps.as_ptr(), deps.len()) });
            n
        };
        let memset = |deps: &[CUgraphNode], at: u64, size: u32, value: u32, width, height| {
            let p = sys::CUDA_MEMSET_NODE_PARAMS {
                dst: mem + at,
                pitch: 256,
                value,
                elementSize: size,
                width,
                height,
            };
            let mut n = ptr::null_mut();
            let deps_ptr = if deps.is_empty() {
                ptr::null()
            } else {
                deps.as_ptr()
            };
            // SAFETY: `deps` are nodes of `g`; the range lies inside `mem`.
            ok(unsafe {
                sys::cuGraphAddMemsetNode(&mut n, g, deps_ptr, deps.len(), &p, dev.cu.cu_ctx())
            });
            n
        };
        let (a, b) = (empty(&[]), empty(&[]));
        let _m1 = memset(&[a, b], 0, 4, 0x1122_3344, 64, 1);
        let (c, d) = (empty(&[_m1]), empty(&[_m1]));
        let _m2 = memset(&[c], 512, 2, 0xbeef, 100, 1);
        let m3 = memset(&[d], 1024, 1, 0x5a, 16, 2);
        let _m4 = memset(&[], 2048, 1, 0x77, 1000, 1);
        let m5 = memset(&[_m4], 4096, 4, 0x9999, MAX_BYTES / 4 + 1, 1);
        let memsets = MemsetNodes::default();
        assert_eq!(memsets.rewrite(&dev.cu, g).unwrap(), 3);
        assert_eq!(*memsets.error.lock().unwrap(), None);
        let mut n = 0usize;
        // SAFETY: a null array asks for the count.
        ok(unsafe { sys::cuGraphGetNodes(g, ptr::null_mut(), &mut n) });
        let mut nodes = vec![ptr::null_mut(); n];
        // SAFETY: `nodes` holds `n` entries.
        ok(unsafe { sys::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut n) });
        let kernels: Vec<_> = nodes
            .iter()
            .copied()
            .filter(|&n| kind(n) == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL)
            .collect();
        let left: Vec<_> = nodes
            .iter()
            .copied()
            .filter(|&n| kind(n) == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET)
            .collect();
        assert_eq!(
            set(left),
            set(vec![m3, m5]),
            "the 2-D and the large memset stay"
        );
        let edges = |n| {
            (
                set(neighbours(n, false).unwrap().unwrap()),
                set(neighbours(n, true).unwrap().unwrap()),
            )
        };
        let mut got: Vec<_> = kernels.iter().map(|&k| edges(k)).collect();
        got.sort();
        let mut want = vec![
            (set(vec![a, b]), set(vec![c, d])),
            (set(vec![c]), BTreeSet::new()),
            (BTreeSet::new(), set(vec![m5])),
        ];
        want.sort();
        assert_eq!(got, want, "(dependencies, dependents) of the kernel nodes");
        assert_eq!(edges(m3), (set(vec![d]), BTreeSet::new()));

        let s = dev.create_stream(0).unwrap();
        // SAFETY: `mem` holds 4096 bytes; `s` is a live stream.
        ok(unsafe { sys::cuMemsetD8Async(mem, 0, 4096, s) });
        let mut exec = ptr::null_mut();
        // SAFETY: `g` is a complete graph of this context.
        ok(unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, g, 0) });
        // SAFETY: as above.
        ok(unsafe { sys::cuGraphLaunch(exec, s) });
        let mut host = vec![0u8; 4096];
        // SAFETY: `s` is a live stream; `host` holds 4096 bytes, copied after the replay.
        unsafe {
            ok(sys::cuStreamSynchronize(s));
            ok(sys::cuMemcpyDtoH_v2(
                host.as_mut_ptr() as *mut c_void,
                mem,
                4096,
            ));
        }
        let mut want = vec![0u8; 4096];
        for w in want[..256].chunks_mut(4) {
            w.copy_from_slice(&0x1122_3344u32.to_le_bytes());
        }
        for w in want[512..712].chunks_mut(2) {
            w.copy_from_slice(&0xbeefu16.to_le_bytes());
        }
        want[1024..1040].fill(0x5a);
        want[1280..1296].fill(0x5a);
        want[2048..3048].fill(0x77);
        assert_eq!(host, want);
        // SAFETY: nothing is in flight (synchronized above); nothing uses these afterwards.
        unsafe {
            ok(sys::cuGraphExecDestroy(exec));
            ok(sys::cuGraphDestroy(g));
            dev.destroy_stream(s).unwrap();
            dev.free(mem).unwrap();
        }
    }
}
