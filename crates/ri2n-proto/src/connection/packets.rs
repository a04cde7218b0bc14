//! Outgoing packets: what the next datagram is (CLOSE, handshake, probe, MTU probe, PING,
//! data, acknowledgement, in that order of priority), and building it in place in the
//! driver's buffer with frame sizes bounded by `wire`. Data goes out in bursts: what is due
//! is decided once, then data packets follow at the same instant while the buffer takes them.

use std::net::SocketAddr;
use std::time::Instant;

use smallvec::SmallVec;

use crate::crypto::{self, PacketProtection};
use crate::link::{SentFrame, SentPacket};
use crate::streams::SendStream;
use crate::transmit::{Transmit, TransmitBuffer};
use crate::wire::{self, Header, Writer};
use crate::{LinkId, LinkState};

use super::scheduler::Schedule;
use super::send_limits::SendState;
use super::{CloseRepeat, Connection, ConnectionState, HandshakeStage, CLOSE_DONE};

/// Room a CLOSE of code 0 with an empty reason needs after the acknowledgements before it.
const CLOSE_DONE_ROOM: usize = 3;

/// Data packets one call builds at most: bursts are long enough to pay what is decided once
/// per burst over many packets, and short enough that connections take turns.
const MAX_BURST: usize = 32;

/// Bytes at the head of a flow-blocked stream re-sent at once by opportunistic retransmission.
const RESCUE_BYTES: u64 = 64 * 1024;

/// Which kind of packet to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PacketKind {
    /// Probe of a link that is not up, padded to the base datagram size.
    Probe,
    /// Path MTU probe of an up link, padded to the size probed.
    MtuProbe(usize),
    /// Small ack-eliciting packet (probe timeout, keepalive, handshake confirmation).
    Ping,
    /// Stream data and control frames.
    Data,
    /// Acknowledgements only (plus control frames, if any wait).
    AckOnly,
}

/// What a call of [`Connection::poll_transmit`] built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Built {
    /// Datagrams built.
    pub datagrams: usize,
    /// Whether another call at the same instant could build more. False after a burst of
    /// data that ended for want of anything to send: nothing is due then (see
    /// [`Connection::nothing_due_after_data`]), and the endpoint need not ask again until
    /// something happens to the connection (a request-response exchange saves a call per
    /// message that would find nothing).
    pub more: bool,
}

impl Connection {
    /// Builds the next datagram into `out` and, if it was data and `out` wants more, the rest
    /// of a burst of data at this instant.
    pub(crate) fn poll_transmit(&mut self, now: Instant, out: &mut dyn TransmitBuffer) -> Built {
        self.scheduling.data_blocked = None;
        let built = self.build_datagrams(now, out);
        let state = self.send_state();
        self.send_clock.enter(now, state);
        built
    }

    /// [`Self::poll_transmit`]'s packets.
    fn build_datagrams(&mut self, now: Instant, out: &mut dyn TransmitBuffer) -> Built {
        let mut schedule = None;
        let Some(t) = self.next_datagram(now, out, &mut schedule) else {
            return Built {
                datagrams: 0,
                more: false,
            };
        };
        out.commit(&t);
        match &mut schedule {
            Some(schedule) => Built {
                datagrams: 1 + self.data_burst(now, schedule, out),
                more: !self.nothing_due_after_data(now),
            },
            None => Built {
                datagrams: 1,
                more: true,
            },
        }
    }

    /// After a burst of data at `now`: whether nothing is left to send at that instant. What
    /// [`Self::next_datagram`] looks at before data was not due, and data does not make it
    /// due (see [`Self::data_burst`]); what it looks at after data is looked at here: data
    /// or datagrams still waiting (a window, pacing or a full buffer ended the burst),
    /// control frames the packets had no room for, acknowledgements due.
    fn nothing_due_after_data(&self, now: Instant) -> bool {
        !self.data_waiting() && !self.control_waiting() && !self.ack_due(now)
    }

    /// What held the sender back after a send decision ([`SendState`]). Data still waiting
    /// went out unless the last choice of a link for it found none (`data_blocked`). With
    /// nothing held back, the connection is sending (at its own pace: its application's,
    /// its thread's) while anything it sent awaits acknowledgement, and idle otherwise: as
    /// Linux counts a TCP connection busy while it has data in flight.
    fn send_state(&self) -> SendState {
        if !self.can_send_short() {
            SendState::Idle
        } else if self.data_waiting() {
            match self.scheduling.data_blocked {
                _ if !self.links.iter().any(|l| l.is_up()) => SendState::NoLink,
                None => SendState::Sending,
                Some(Some(_)) => SendState::Pacing,
                Some(None) => SendState::CongestionWindow,
            }
        } else if self.send.iter().any(SendStream::waits_for_peer_window) {
            SendState::PeerWindow
        } else if self.write_wants.iter().any(Option::is_some) {
            SendState::SendBuffer
        } else if self.send.iter().any(|s| s.buffered() > 0)
            || self.links.iter().any(|l| l.bytes_in_flight() > 0)
        {
            SendState::Sending
        } else {
            SendState::Idle
        }
    }

    /// Whether datagrams or stream data wait to be sent.
    fn data_waiting(&self) -> bool {
        !self.datagrams.outgoing.is_empty() || self.send.iter().any(SendStream::wants_to_send)
    }

    /// Whether control frames (window updates, link states) wait to be sent.
    fn control_waiting(&self) -> bool {
        self.max_data_pending.iter().any(|&p| p) || !self.link_status_pending.is_empty()
    }

    /// Whether some link owes the peer an acknowledgement now.
    fn ack_due(&self, now: Instant) -> bool {
        self.links.iter().any(|l| l.ack.is_due(now))
    }

    /// The data packets after the first of a burst at `now`, until `out` wants no more, there
    /// is no data, no link lets a packet out, or [`MAX_BURST`] is reached. What
    /// [`Self::next_datagram`] checks before data is not checked again: none of it was due,
    /// and sending data makes none of it due at the same instant (a keepalive is put off by
    /// data; probes, probe timeouts and MTU probes do not depend on it).
    fn data_burst(
        &mut self,
        now: Instant,
        schedule: &mut Schedule,
        out: &mut dyn TransmitBuffer,
    ) -> usize {
        let mut built = 0;
        while built + 1 < MAX_BURST && out.wants_more() && self.data_waiting() {
            let i = match self.pick_next_data_link(schedule, now) {
                Ok(i) => i,
                Err(wake) => {
                    self.scheduling.data_blocked = Some(wake);
                    break;
                }
            };
            let t = self.transmit(now, i, PacketKind::Data, out);
            schedule.sent_on(i, &self.links[i], now);
            out.commit(&t);
            built += 1;
        }
        built
    }

    /// Builds the next datagram into the buffer `out` gives for its path. For data, also
    /// leaves the schedule that placed it in `schedule`.
    fn next_datagram(
        &mut self,
        now: Instant,
        out: &mut dyn TransmitBuffer,
        schedule: &mut Option<Schedule>,
    ) -> Option<Transmit> {
        if self.state == ConnectionState::Closed {
            let i = self.closing.sends.pop()?;
            let (code, reason) = self.closing.frame.clone().unwrap_or_default();
            let len = self.build_close(i, code, &reason, out);
            let (local, remote) = (self.links[i].local, self.links[i].remote);
            if self.closing.sends.is_empty() && self.closing.repeat == CloseRepeat::Owed {
                self.closing.repeat = CloseRepeat::At(now + self.close_repeat_delay());
            }
            return Some(Transmit { local, remote, len });
        }
        if let Some(t) = self.poll_handshake(now, out) {
            return Some(t);
        }
        if !self.can_send_short() {
            return None;
        }
        // 1. probes of links that are not up
        if let Some(i) = (0..self.links.len()).find(|&i| self.links[i].probe_due(now)) {
            let mut outcome = std::mem::take(&mut self.scratch);
            let failed = self.links[i].on_probe_sending(now, &self.cfg, &mut outcome);
            self.apply_outcome(now, &mut outcome);
            self.scratch = outcome;
            if failed {
                tracing::debug!(link = i, "probes of the degraded or validating link failed");
                self.set_link_state(i, now, LinkState::Down);
                if self.state == ConnectionState::Closed {
                    return None; // that was the last link of a peer that is gone
                }
            }
            return Some(self.transmit(now, i, PacketKind::Probe, out));
        }
        // 2. probe timeouts, keepalives and the handshake confirmation on up links (their
        // timers marked them owed: the deadlines are not computed again for every datagram)
        let ping = self.ping_pending.take().or_else(|| {
            (0..self.links.len()).find(|&i| {
                let l = &self.links[i];
                l.is_up() && (l.recovery.pto_probes_pending > 0 || self.pings_owed & 1 << i != 0)
            })
        });
        if let Some(i) = ping {
            self.pings_owed &= !(1 << i);
            let l = &mut self.links[i];
            l.recovery.pto_probes_pending = l.recovery.pto_probes_pending.saturating_sub(1);
            return Some(self.transmit(now, i, PacketKind::Ping, out));
        }
        // 3. path MTU probes (one at a time per link, outside the congestion window)
        if let Some((i, size)) =
            (0..self.links.len()).find_map(|i| Some((i, self.links[i].mtu_probe_due(now)?)))
        {
            return Some(self.transmit(now, i, PacketKind::MtuProbe(size), out));
        }
        // 4. stream data, striped over the up links with window and pacing room
        let control_waiting = self.control_waiting();
        if let Some(patience) = self.rescue_patience() {
            for (s, &wants) in self.send.iter_mut().zip(&self.write_wants) {
                s.rescue_head(RESCUE_BYTES, now, patience, wants);
            }
        }
        self.datagrams.outgoing.drop_stale(now);
        if self.data_waiting() {
            match self.pick_data_link(now, schedule) {
                Ok(i) => {
                    let t = self.transmit(now, i, PacketKind::Data, out);
                    if let Some(schedule) = schedule {
                        schedule.sent_on(i, &self.links[i], now);
                    }
                    return Some(t);
                }
                Err(wake) => {
                    self.scheduling.pacing_wakeup = wake;
                    self.scheduling.data_blocked = Some(wake);
                }
            }
        }
        // control frames do not wait for congestion windows
        if control_waiting {
            if let Some(i) = self.best_up_link() {
                return Some(self.transmit(now, i, PacketKind::AckOnly, out));
            }
        }
        // 5. acknowledgements
        if self.ack_due(now) {
            match self.ack_link() {
                Some(i) => return Some(self.transmit(now, i, PacketKind::AckOnly, out)),
                // only an unproven address could carry them, and it had its share: they are
                // not sent now (their ranges stay, for the next packet that carries any)
                None => {
                    for l in self.links.iter_mut().filter(|l| l.ack.is_due(now)) {
                        l.ack.on_sent();
                    }
                }
            }
        }
        None
    }

    fn poll_handshake(&mut self, now: Instant, out: &mut dyn TransmitBuffer) -> Option<Transmit> {
        let link = &self.links[0];
        let max = link.pmtu.base();
        let (local, remote) = (link.local, link.remote);
        match &mut self.handshake.stage {
            HandshakeStage::Client {
                paths,
                next_path,
                token,
                next_initial,
                backoff,
                first_sent,
                mode,
                hello,
                ..
            } if *next_initial <= now => {
                // once the first retransmission went unanswered too, the path is probably down:
                // retry at the pace a down link is probed at, so a heal is noticed as fast
                *next_initial = now + *backoff;
                *backoff = self.cfg.probe_interval;
                first_sent.get_or_insert(now);
                // without a cookie yet, each INITIAL takes the next path that was not refused
                // (the first takes link 0's): one path down at the start holds up the
                // handshake by one retransmission interval, not for as long as it is down
                let (local, remote) = if token.is_empty() {
                    let n = paths.len();
                    let k = (0..n)
                        .map(|j| (*next_path + j) % n)
                        .find(|&k| !paths[k].refused())?;
                    *next_path = (k + 1) % n;
                    (paths[k].local, paths[k].remote)
                } else {
                    (local, remote)
                };
                let header = Header::Initial {
                    scid: self.handshake.local_cid,
                    token,
                    mode: *mode,
                    hello,
                };
                let buf = datagram_room(out, local, remote, max);
                if buf.len() < wire::control_packet_len(&header) {
                    return None;
                }
                let len = wire::encode_control_packet(&header, buf);
                Some(Transmit { local, remote, len })
            }
            HandshakeStage::Server {
                accept,
                accept_pending: pending @ true,
                ..
            } => {
                *pending = false;
                let buf = datagram_room(out, local, remote, max);
                buf[..accept.len()].copy_from_slice(accept);
                Some(Transmit {
                    local,
                    remote,
                    len: accept.len(),
                })
            }
            _ => None,
        }
    }

    fn transmit(
        &mut self,
        now: Instant,
        i: usize,
        kind: PacketKind,
        out: &mut dyn TransmitBuffer,
    ) -> Transmit {
        let len = self.build_packet(now, i, kind, out);
        let (local, remote) = (self.links[i].local, self.links[i].remote);
        Transmit { local, remote, len }
    }

    fn build_close(
        &mut self,
        i: usize,
        code: u64,
        reason: &str,
        out: &mut dyn TransmitBuffer,
    ) -> usize {
        let link = &self.links[i];
        let (pn, id) = (link.recovery.next_pn(), link.id);
        let tag = self.tag_len();
        let phase = self
            .handshake
            .protection
            .as_ref()
            .map_or(0, PacketProtection::send_phase);
        let buf = datagram_room(out, link.local, link.remote, link.pmtu.base());
        let frames_end = buf.len() - tag;
        let mut w = Writer::new(&mut buf[..frames_end]);
        wire::write_short_header(&mut w, self.handshake.peer_cid, id, pn, phase);
        let header_len = w.len();
        if code == CLOSE_DONE {
            // The clean-end confirmation carries its proof (PROTOCOL.md §8.2): what arrived on
            // every link, so the peer learns from acknowledgements, not from our word, that
            // everything it sent was received.
            for l in &self.links {
                let room = w.remaining().saturating_sub(CLOSE_DONE_ROOM);
                wire::write_ack(&mut w, l.id, 0, l.ack.ranges(), room);
            }
        }
        let room = w.remaining();
        let reason = wire::utf8_prefix(reason, wire::close_reason_room(code, room));
        wire::write_close(&mut w, code, reason.as_bytes(), room);
        let len = w.finish();
        let len = self.seal(id, pn, header_len, &mut buf[..len + tag]);
        let pkt = SentPacket {
            time: self.last_rx,
            size: len as u16,
            in_flight: false,
            ack_eliciting: false,
            probe: false,
            mtu_probe: false,
            frames: SmallVec::new(),
        };
        self.links[i].on_sent(self.last_rx, len, pkt);
        len
    }

    fn build_packet(
        &mut self,
        now: Instant,
        i: usize,
        kind: PacketKind,
        out: &mut dyn TransmitBuffer,
    ) -> usize {
        let pn = self.links[i].recovery.next_pn();
        let link_id = self.links[i].id;
        let tag = self.tag_len();
        let seals_later = out.seals_later();
        // stream bytes left for the driver to put in (see `TransmitBuffer::takes_payload`):
        // (position in the datagram, stream, offset, length)
        let by_reference = out.takes_payload();
        debug_assert!(
            !by_reference || seals_later,
            "payloads go in before the sealing"
        );
        let mut deferred: SmallVec<[(usize, usize, u64, usize); 2]> = SmallVec::new();
        let phase = match &mut self.handshake.protection {
            Some(p) => {
                p.update_if_due(now);
                p.send_phase()
            }
            None => 0,
        };
        let link = &mut self.links[i];
        let (local, remote) = (link.local, link.remote);
        let size = match kind {
            PacketKind::Probe => link.pmtu.base(),
            PacketKind::MtuProbe(size) => size,
            PacketKind::Ping | PacketKind::Data | PacketKind::AckOnly => link.mss(),
        };
        let buf = datagram_room(out, local, remote, size);
        if buf.len() < size {
            // the driver cannot hand out that much: never try to grow beyond what it can
            link.pmtu.limit_ceiling(buf.len());
        }
        let frames_end = buf.len() - tag; // the AEAD's tag follows the frames
        let mut w = Writer::new(&mut buf[..frames_end]);
        wire::write_short_header(&mut w, self.handshake.peer_cid, link_id, pn, phase);
        let header_len = w.len();
        let end = w.len() + w.remaining(); // room for frames
        let mut frames: SmallVec<[SentFrame; 2]> = SmallVec::new();
        let mut ack_eliciting = false;

        if matches!(
            kind,
            PacketKind::Probe | PacketKind::MtuProbe(_) | PacketKind::Ping
        ) {
            w.u8(wire::frame_type::PING);
            ack_eliciting = true;
        }
        // Probes carry nothing else. An MTU probe is meant to be lost when the size is too
        // large. A probe of a link that is not up is lost for as long as the link is dead,
        // and what it took is gone with it: acknowledgements another link should carry (the
        // peer's link cannot come back while they ride our dead one's probes), and control
        // frames, which would be handed back at the probe's expiry only to be taken again by
        // the same link's next probe, never reaching a link that came back (a window update
        // stuck that way stalls the peer for good). Both go by their own ways instead.
        let end_of_frames = if matches!(kind, PacketKind::MtuProbe(_) | PacketKind::Probe) {
            w.len()
        } else {
            end
        };
        // how datagrams go, if a data packet may carry one (stream data packets skip this)
        let bounds = (kind == PacketKind::Data && !self.datagrams.outgoing.is_empty())
            .then(|| self.datagram_bounds());
        // acknowledgements for every link with news (at most half a data packet, and never
        // the room the next datagram needs: it must not wait behind acknowledgements)
        let ack_room = if kind == PacketKind::Data {
            let datagram = bounds
                .and_then(|b| self.datagrams.outgoing.front_frame_len(b))
                .unwrap_or(0);
            ((end_of_frames - w.len()) / 2).min((end_of_frames - w.len()).saturating_sub(datagram))
        } else {
            end_of_frames - w.len()
        };
        let ack_end = w.len() + ack_room;
        for l in &mut self.links {
            if !l.ack.is_pending() {
                continue;
            }
            let delay = l.ack.delay(now).as_micros() as u64;
            let room = ack_end.saturating_sub(w.len());
            if wire::write_ack(&mut w, l.id, delay, l.ack.ranges(), room) {
                l.ack.on_sent();
            }
        }
        // Control frames go only on a link in use (up, or degraded and still acknowledged).
        // An acknowledgement sent over any other (the last arrival link while none is up) is
        // lost for as long as that link is dead, and nothing declares it lost: it is not in
        // flight, and only that link's acknowledgements could show the gap. A window update
        // on it would stall the peer for good; they wait for a link in use instead.
        let control_end = match self.links[i].state {
            LinkState::Up | LinkState::Degraded => end_of_frames,
            _ => w.len(),
        };
        for s in 0..2 {
            if self.max_data_pending[s] && control_end - w.len() >= 11 {
                self.max_data_pending[s] = false;
                wire::write_max_stream_data(&mut w, s as u8, self.recv[s].max_data_sent);
                frames.push(SentFrame::MaxStreamData { stream: s as u8 });
                ack_eliciting = true;
            }
        }
        while control_end - w.len() >= 3 {
            let Some((link, status)) = self.link_status_pending.pop() else {
                break;
            };
            wire::write_link_status(&mut w, link, status);
            frames.push(SentFrame::LinkStatus { link, status });
            ack_eliciting = true;
        }
        // datagrams first (they are sent once, and a late one is worth less), then stream
        // data, alternating between the streams
        if kind == PacketKind::Data {
            while let Some(piece) =
                bounds.and_then(|b| self.datagrams.outgoing.pop(now, end - w.len(), b))
            {
                let room = end - w.len();
                piece.write(&mut w, room);
                frames.push(SentFrame::Datagram(piece));
                ack_eliciting = true;
            }
            let mut stream_bytes = 0u64;
            for _ in 0..2 {
                let s = self.scheduling.next_stream;
                self.scheduling.next_stream ^= 1;
                // type + offset (up to 8) + length (2: frames stay below 16 KiB)
                let room = end - w.len();
                if room <= 11 {
                    break;
                }
                let Some(chunk) = self.send[s].next_chunk(room - 11) else {
                    continue;
                };
                wire::write_stream_header(&mut w, s as u8, chunk.offset, chunk.fin, chunk.len);
                if by_reference {
                    deferred.push((w.len(), s, chunk.offset, chunk.len));
                    let _ = w.slot(chunk.len);
                } else {
                    self.send[s].copy_out(chunk.offset, w.slot(chunk.len));
                }
                frames.push(SentFrame::Stream {
                    stream: s as u8,
                    chunk,
                });
                stream_bytes += chunk.len as u64;
                ack_eliciting = true;
            }
            self.links[i].counters.stream_bytes_sent += stream_bytes;
        }
        let full = match kind {
            PacketKind::Probe => self.links[i].probe_is_full(),
            PacketKind::MtuProbe(_) => true,
            _ => false,
        };
        if full {
            // full size: the probe also checks that the path carries datagrams of its size
            let pad = end - w.len();
            w.zeros(pad);
        } else {
            // large enough to be answered with a RESET by a peer that lost the connection: an
            // unkeyed PING is smaller, and a side whose peer ended the connection unheard
            // (on a deadline of its own) would probe it for ever, never told
            let short = crate::endpoint::MIN_RESET_TRIGGER.saturating_sub(w.len() + tag);
            w.zeros(short);
        }
        let len = w.finish() + tag;
        match &mut self.handshake.protection {
            Some(p) if seals_later => out.defer_seal(p.seal_later(link_id, pn, header_len)),
            _ => {
                self.seal(link_id, pn, header_len, &mut buf[..len]);
            }
        }
        for &(at, s, offset, n) in &deferred {
            self.send[s].payload(offset, n, |pos, piece, r| {
                out.defer_payload(at + pos, piece, r)
            });
        }
        let link = &mut self.links[i];
        let pkt = SentPacket {
            time: now,
            size: len as u16,
            in_flight: link.is_up() && ack_eliciting && !matches!(kind, PacketKind::MtuProbe(_)),
            ack_eliciting,
            probe: kind == PacketKind::Probe,
            mtu_probe: matches!(kind, PacketKind::MtuProbe(_)),
            frames,
        };
        if pkt.mtu_probe {
            link.pmtu.on_probe_sent();
        }
        link.on_sent(now, len, pkt);
        len
    }
}

impl Connection {
    /// Bytes the AEAD adds to each short packet (none without a key).
    pub(super) fn tag_len(&self) -> usize {
        if self.handshake.protection.is_some() {
            crypto::TAG_LEN
        } else {
            0
        }
    }

    /// Seals a built packet in place (`packet`: header, frames and room for the tag), if the
    /// connection has a key; returns the datagram's length.
    fn seal(&mut self, link: LinkId, pn: u64, header_len: usize, packet: &mut [u8]) -> usize {
        if let Some(p) = &mut self.handshake.protection {
            p.seal(link, pn, header_len, packet);
        }
        packet.len()
    }
}

/// The driver's room for the next datagram on a path, cut to `max` bytes.
fn datagram_room(
    out: &mut dyn TransmitBuffer,
    local: SocketAddr,
    remote: SocketAddr,
    max: usize,
) -> &mut [u8] {
    let buf = out.buffer(local, remote);
    let len = buf.len().min(max);
    &mut buf[..len]
}
