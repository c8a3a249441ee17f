//! Owned LLC messages.
//!
//! `smc-wire`'s [`LlcMessage`] borrows the variable-length lists of the SMC-Rv2 messages
//! (the ADD LINK v2 rtoken list, the DELETE RKEY v2 rkey list) from the bytes it parsed.
//! The machine has to keep messages beyond the call that produced them (outputs the runtime
//! polls later, requests deferred by the collision rules of RFC 7609 §3.5.5.3, requests
//! echoed back as Linux does), so [`LlcOut`] owns those lists and lends a wire view out.

use smc_wire::llc::{
    AddLinkRtoken, AddLinkV2Ext, DeleteRkeyV2, LlcFormat, LlcMessage, LlcType, RkeyList, RtokenList,
};

/// An LLC message with owned contents: [`LlcOut::as_wire`] gives the `smc-wire` value to
/// encode, [`LlcOut::encode`] the bytes to SEND.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlcOut {
    /// The message with empty list views; the lists live below.
    msg: LlcMessage<'static>,
    rtokens: Vec<AddLinkRtoken>,
    rkeys: Vec<u32>,
}

impl LlcOut {
    /// Copies a message (and its lists).
    pub fn new(msg: &LlcMessage<'_>) -> LlcOut {
        let mut rtokens = Vec::new();
        let mut rkeys = Vec::new();
        let msg: LlcMessage<'static> = match msg {
            LlcMessage::ConfirmLink(m) => LlcMessage::ConfirmLink(*m),
            LlcMessage::AddLink(m) => {
                let ext = m.ext.map(|e| {
                    rtokens.extend(e.rtokens.iter());
                    AddLinkV2Ext {
                        v2_direct: e.v2_direct,
                        client_target_gid: e.client_target_gid,
                        rtokens: RtokenList::Slice(&[]),
                    }
                });
                LlcMessage::AddLink(smc_wire::llc::AddLink {
                    v2: m.v2,
                    response: m.response,
                    reject: m.reject,
                    reject_reason: m.reject_reason,
                    mac: m.mac,
                    gid: m.gid,
                    qpn: m.qpn,
                    link_num: m.link_num,
                    qp_mtu: m.qp_mtu,
                    psn: m.psn,
                    ext,
                })
            }
            LlcMessage::AddLinkCont(m) => LlcMessage::AddLinkCont(*m),
            LlcMessage::DeleteLink(m) => LlcMessage::DeleteLink(*m),
            LlcMessage::ReqAddLink(m) => LlcMessage::ReqAddLink(m.clone()),
            LlcMessage::ConfirmRkey(m) => LlcMessage::ConfirmRkey(*m),
            LlcMessage::ConfirmRkeyCont(m) => LlcMessage::ConfirmRkeyCont(*m),
            LlcMessage::DeleteRkey(m) => LlcMessage::DeleteRkey(*m),
            LlcMessage::DeleteRkeyV2(m) => {
                rkeys.extend(m.rkeys.iter());
                LlcMessage::DeleteRkeyV2(DeleteRkeyV2 {
                    response: m.response,
                    negative: m.negative,
                    num_inval_rkeys: m.num_inval_rkeys,
                    rkeys: RkeyList::Slice(&[]),
                })
            }
            LlcMessage::TestLink(m) => LlcMessage::TestLink(*m),
        };
        LlcOut {
            msg,
            rtokens,
            rkeys,
        }
    }

    /// The message as `smc-wire` sees it (lists borrowed from `self`).
    pub fn as_wire(&self) -> LlcMessage<'_> {
        match &self.msg {
            LlcMessage::AddLink(m) => {
                let mut m = *m;
                if let Some(e) = m.ext.as_mut() {
                    e.rtokens = RtokenList::Slice(&self.rtokens);
                }
                LlcMessage::AddLink(m)
            }
            LlcMessage::DeleteRkeyV2(m) => {
                let mut m = *m;
                m.rkeys = RkeyList::Slice(&self.rkeys);
                LlcMessage::DeleteRkeyV2(m)
            }
            other => other.clone(),
        }
    }

    /// The message type.
    pub fn msg_type(&self) -> LlcType {
        self.msg.msg_type()
    }

    /// Whether the response flag is set.
    pub fn is_response(&self) -> bool {
        self.msg.is_response()
    }

    /// Bytes on the wire.
    pub fn buffer_len(&self) -> usize {
        self.as_wire().buffer_len()
    }

    /// Encodes the message in `fmt` (the link group's [`super::LlcConfig::format`]).
    ///
    /// Every message the machine produces encodes without error; an error here means a
    /// message was built by hand with out-of-range values.
    pub fn encode(&self, fmt: LlcFormat) -> Result<Vec<u8>, smc_wire::Error> {
        let m = self.as_wire();
        let mut buf = vec![0u8; m.buffer_len()];
        let n = m.emit(&mut buf, fmt)?;
        buf.truncate(n);
        Ok(buf)
    }
}

impl From<&LlcMessage<'_>> for LlcOut {
    fn from(m: &LlcMessage<'_>) -> LlcOut {
        LlcOut::new(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smc_wire::common::{Gid, Mac, U24};
    use smc_wire::llc::AddLink;

    #[test]
    fn owned_lists_round_trip() {
        let rts = [AddLinkRtoken {
            rmb_key: 1,
            rmb_key_new: 2,
            rmb_vaddr_new: 3,
        }];
        let m = LlcMessage::AddLink(AddLink {
            v2: true,
            response: false,
            reject: false,
            reject_reason: 0,
            mac: Mac([1; 6]),
            gid: Gid([2; 16]),
            qpn: U24::new(0x12).unwrap(),
            link_num: 2,
            qp_mtu: 3,
            psn: U24::new(5).unwrap(),
            ext: Some(AddLinkV2Ext {
                v2_direct: true,
                client_target_gid: Gid([2; 16]),
                rtokens: RtokenList::Slice(&rts),
            }),
        });
        let o = LlcOut::new(&m);
        assert_eq!(o.as_wire(), m);
        let bytes = o.encode(LlcFormat::LINUX_X86).unwrap();
        assert_eq!(bytes.len(), 88);
        let back = LlcMessage::parse(&bytes, LlcFormat::LINUX_X86).unwrap();
        assert_eq!(LlcOut::new(&back), o);

        let keys = [7u32, 8, 9];
        let d = LlcMessage::DeleteRkeyV2(DeleteRkeyV2 {
            response: true,
            negative: true,
            num_inval_rkeys: 1,
            rkeys: RkeyList::Slice(&keys),
        });
        let o = LlcOut::new(&d);
        assert_eq!(o.as_wire(), d);
        assert_eq!(o.msg_type(), LlcType::DeleteRkey);
        assert!(o.is_response());
    }
}
