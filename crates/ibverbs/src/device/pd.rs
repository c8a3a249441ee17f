//! Protection domains and memory regions.

use std::any::Any;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, RwLock};

use smc_verbs::{
    AccessFlags, MrOps, PdOps, QpCap, QpInitAttr, QpOps, QpState, RdmaBuffer, Result, VerbsError,
};
use tracing::warn;

use super::cq::CqInner;
use super::qp::QpInner;
use super::{errno_error, lock, Ctx, DevInner};
use crate::ffi;

/// The `ibv_pd` itself, shared by the PD handle and every MR and QP in it: ibverbs
/// refuses to deallocate a PD that still has objects (EBUSY), whatever order the handles
/// are dropped in.
pub(super) struct PdRaw {
    ctx: Arc<Ctx>,
    pd: *mut ffi::ibv_pd,
    /// The PD's regions by lkey, for INLINE sends (see [`inline_addr`]).
    spans: RwLock<HashMap<u32, Span>>,
}

/// Where a memory region lies: its I/O virtual address and the process address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Span {
    pub iova: u64,
    pub va: u64,
    pub len: u64,
}

/// The process address of `[addr, addr+len)` given in I/O-virtual space, for an INLINE
/// SGE: the CPU copies inline data at post time from that address (verbs.h: "the
/// buffer is read directly", no lkey check), while `smc-verbs` SGEs name memory by the
/// region's (random) I/O virtual address (`Mr::sge`). The region named by `lkey` is
/// tried first, then any region of the PD (lkeys are not checked for INLINE, as the
/// software RNIC does); `None` when no region of the PD covers it, so no SGE can make
/// libibverbs read memory outside the PD's registered buffers.
pub(super) fn inline_addr(
    spans: &HashMap<u32, Span>,
    lkey: u32,
    addr: u64,
    len: u64,
) -> Option<u64> {
    let covers = |s: &Span| {
        addr >= s.iova
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= s.iova.saturating_add(s.len))
    };
    spans
        .get(&lkey)
        .filter(|s| covers(s))
        .or_else(|| spans.values().find(|s| covers(s)))
        .map(|s| s.va + (addr - s.iova))
}

impl PdRaw {
    pub(super) fn inline_addr(&self, lkey: u32, addr: u64, len: u64) -> Option<u64> {
        inline_addr(
            &self.spans.read().unwrap_or_else(|e| e.into_inner()),
            lkey,
            addr,
            len,
        )
    }
}

// SAFETY: ibv_pd may be used from any thread; the pointer is valid until Drop.
unsafe impl Send for PdRaw {}
// SAFETY: as above.
unsafe impl Sync for PdRaw {}

impl Drop for PdRaw {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this PD holds an Arc to it, so none is left.
        let rc = unsafe { (self.ctx.api.dealloc_pd)(self.pd) };
        if rc != 0 {
            warn!(rc, "ibv_dealloc_pd failed");
        }
    }
}

pub(super) struct PdInner {
    raw: Arc<PdRaw>,
    ctx: Arc<Ctx>,
    pub(super) pd: *mut ffi::ibv_pd,
    port: u8,
    gid_index: u8,
}

// SAFETY: as PdRaw.
unsafe impl Send for PdInner {}
// SAFETY: as PdRaw.
unsafe impl Sync for PdInner {}

impl PdInner {
    pub(super) fn alloc(d: &DevInner) -> Result<PdInner> {
        // SAFETY: valid context.
        let pd = unsafe { (d.ctx.api.alloc_pd)(d.ctx.ctx) };
        if pd.is_null() {
            return Err(errno_error("ibv_alloc_pd", 0));
        }
        Ok(PdInner {
            raw: Arc::new(PdRaw {
                ctx: d.ctx.clone(),
                pd,
                spans: RwLock::new(HashMap::new()),
            }),
            ctx: d.ctx.clone(),
            pd,
            port: d.port,
            gid_index: d.gid_index,
        })
    }
}

pub(super) fn access_bits(a: AccessFlags) -> c_int {
    // The smc-verbs flags have the IBV_ACCESS_* values (LOCAL_WRITE=1, REMOTE_WRITE=2,
    // REMOTE_READ=4, REMOTE_ATOMIC=8).
    a.bits() as c_int
}

impl PdOps for PdInner {
    fn reg_mr(
        &self,
        buf: Arc<RdmaBuffer>,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<Box<dyn MrOps>> {
        if !buf.contains(offset, len) {
            return Err(VerbsError::InvalidArgument("MR range outside the buffer"));
        }
        // IBA §10.6.3.1 (as ibverbs): remote write/atomic need local write.
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(VerbsError::InvalidArgument(
                "REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE",
            ));
        }
        // The region's I/O virtual address is random, never the process address (the
        // verbs rule, `PdOps::reg_mr`: an RToken must not reveal our address-space
        // layout). Local SGEs name it in the same space (`Mr::sge`). A libibverbs
        // without `ibv_reg_mr_iova2` can only register at the process address.
        // The NIC writes the bytes by DMA from now on, not through RdmaBuffer's methods:
        // a reused RMB must be zeroed whole (RdmaBuffer::zero_written).
        buf.mark_untracked();
        let start = buf.as_ptr().wrapping_add(offset);
        let (mr, addr) = match self.ctx.api.reg_mr_iova2 {
            Some(reg) => {
                let iova = smc_verbs::random_iova(start as u64);
                // SAFETY: the range lies inside `buf`, which the MR keeps alive (Arc)
                // until it is deregistered.
                let mr = unsafe {
                    reg(
                        self.pd,
                        start as *mut c_void,
                        len,
                        iova,
                        access_bits(access) as u32,
                    )
                };
                (mr, iova)
            }
            None => {
                // SAFETY: as above.
                let mr = unsafe {
                    (self.ctx.api.reg_mr)(self.pd, start as *mut c_void, len, access_bits(access))
                };
                (mr, start as u64)
            }
        };
        if mr.is_null() {
            return Err(errno_error("ibv_reg_mr", 0));
        }
        // SAFETY: `mr` is a valid MR returned above.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        self.raw
            .spans
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                lkey,
                Span {
                    iova: addr,
                    va: start as u64,
                    len: len as u64,
                },
            );
        Ok(Box::new(MrInner {
            _pd: self.raw.clone(),
            ctx: self.ctx.clone(),
            mr,
            lkey,
            rkey,
            addr,
            len,
            access,
            buf,
        }))
    }

    fn create_qp(&self, attr: &QpInitAttr) -> Result<Arc<dyn QpOps>> {
        let scq = attr
            .send_cq
            .0
            .as_any()
            .downcast_ref::<CqInner>()
            .ok_or(VerbsError::WrongDevice)?;
        let rcq = attr
            .recv_cq
            .0
            .as_any()
            .downcast_ref::<CqInner>()
            .ok_or(VerbsError::WrongDevice)?;
        if !Arc::ptr_eq(&scq.ctx, &self.ctx) || !Arc::ptr_eq(&rcq.ctx, &self.ctx) {
            return Err(VerbsError::WrongDevice);
        }
        let mut ia = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: scq.cq,
            recv_cq: rcq.cq,
            srq: std::ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: attr.cap.max_send_wr,
                max_recv_wr: attr.cap.max_recv_wr,
                max_send_sge: attr.cap.max_send_sge,
                max_recv_sge: attr.cap.max_recv_sge,
                max_inline_data: attr.cap.max_inline_data,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: attr.sq_sig_all as c_int,
        };
        // SAFETY: valid PD and CQs of this context; `ia` is fully initialised.
        let qp = unsafe { (self.ctx.api.create_qp)(self.pd, &mut ia) };
        if qp.is_null() {
            return Err(match errno_error("ibv_create_qp", 0) {
                VerbsError::QueueFull => VerbsError::ResourceExhausted("QP"),
                e => e,
            });
        }
        // SAFETY: valid QP; the fast-path functions live in its context's ops table.
        let (qpn, ops) = unsafe { ((*qp).qp_num, &(*(*qp).context).ops) };
        let (Some(post_send), Some(post_recv)) = (ops.post_send, ops.post_recv) else {
            // SAFETY: destroying the QP created above.
            unsafe { (self.ctx.api.destroy_qp)(qp) };
            return Err(VerbsError::DeviceGone("provider has no post_send".into()));
        };
        let inner = Arc::new(QpInner {
            _pd: self.raw.clone(),
            ctx: self.ctx.clone(),
            qp,
            qpn,
            // ibv_create_qp writes the granted capacities back into `ia.cap`.
            cap: QpCap {
                max_send_wr: ia.cap.max_send_wr,
                max_recv_wr: ia.cap.max_recv_wr,
                max_send_sge: ia.cap.max_send_sge,
                max_recv_sge: ia.cap.max_recv_sge,
                max_inline_data: ia.cap.max_inline_data,
            },
            state: Mutex::new(QpState::Reset),
            post_send,
            post_recv,
            port: self.port,
            gid_index: self.gid_index,
            _cqs: (attr.send_cq.clone(), attr.recv_cq.clone()),
        });
        lock(&self.ctx.shared.qps).insert(qpn, Arc::downgrade(&inner));
        Ok(inner)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

pub(super) struct MrInner {
    /// Dropped after the MR is deregistered (fields drop after `Drop::drop`).
    _pd: Arc<PdRaw>,
    ctx: Arc<Ctx>,
    mr: *mut ffi::ibv_mr,
    lkey: u32,
    rkey: u32,
    addr: u64,
    len: usize,
    access: AccessFlags,
    buf: Arc<RdmaBuffer>,
}

// SAFETY: ibv_mr may be used from any thread; the pointer is valid until Drop.
unsafe impl Send for MrInner {}
// SAFETY: as above.
unsafe impl Sync for MrInner {}

impl Drop for MrInner {
    fn drop(&mut self) {
        // SAFETY: deregistering the MR registered in `reg_mr`, once; the buffer is still
        // mapped (we hold an Arc to it).
        let rc = unsafe { (self.ctx.api.dereg_mr)(self.mr) };
        if rc != 0 {
            warn!(rc, "ibv_dereg_mr failed");
        }
        self._pd
            .spans
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.lkey);
    }
}

impl MrOps for MrInner {
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn access(&self) -> AccessFlags {
        self.access
    }
    fn buffer(&self) -> &Arc<RdmaBuffer> {
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_sges_are_translated_to_process_addresses() {
        let mut m = HashMap::new();
        let a = Span {
            iova: 0x1234_5000_0010,
            va: 0x7f00_0000_0010,
            len: 4096,
        };
        let b = Span {
            iova: 0x0abc_0000_0000,
            va: 0x5600_0000_0000,
            len: 64,
        };
        m.insert(7, a);
        m.insert(9, b);
        // by its own lkey, at the start, inside and up to the end
        assert_eq!(inline_addr(&m, 7, a.iova, 44), Some(a.va));
        assert_eq!(inline_addr(&m, 7, a.iova + 100, 44), Some(a.va + 100));
        assert_eq!(inline_addr(&m, 7, a.iova + 4096 - 8, 8), Some(a.va + 4088));
        // lkeys are not checked for INLINE: another region of the PD covering it
        assert_eq!(inline_addr(&m, 7, b.iova + 8, 8), Some(b.va + 8));
        assert_eq!(inline_addr(&m, 99, a.iova, 8), Some(a.va));
        // beyond a region, before it, wrapping, or unregistered: refused
        assert_eq!(inline_addr(&m, 7, a.iova + 4096 - 8, 9), None);
        assert_eq!(inline_addr(&m, 7, a.iova - 1, 4), None);
        assert_eq!(inline_addr(&m, 7, u64::MAX - 2, 8), None);
        assert_eq!(inline_addr(&m, 7, 0x10, 8), None);
        assert_eq!(inline_addr(&HashMap::new(), 7, a.iova, 8), None);
    }
}
