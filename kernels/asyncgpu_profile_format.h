// The wire format of asyncgpu's in-kernel records: its ONE definition.
//
// kernels/asyncgpu_profile.cuh writes it on the GPU; asyncgpu/_kformat.py parses this file when it is imported
// (every line `#define AGK_NAME <integer literal>`, nothing else) and both its decoder and its host-side
// writer use those values; tests/test_kprofile.py compiles static_asserts generated from the Python side with
// NVRTC to check that both sides read the same numbers. Change a value here and both follow.
//
// A buffer is an array of little-endian uint64 words, zeroed before each launch (KernelProfiler.arm):
//
//   header, words 0 .. AGK_HEADER_WORDS-1, as uint32 fields (AGK_HDR_*: index of the uint32)
//     w0   AGK_MAGIC                     | groups per block                (host, at arm)
//     w1   lanes the buffer holds        | capacity: records per lane      (host, at arm)
//     w2   blocks of the launch          | lanes that found no room        (device)
//     w3   max(bad group index + 1)      | zero                            (device)
//   lane (block b, group g) = b * groups + g, at word AGK_HEADER_WORDS + lane * (AGK_LANE_WORDS + capacity)
//     +0   full %globaltimer when the lane started (0: it never started)
//     +1   full %globaltimer at finalize
//     +2   bits  0-31 records attempted (kept + dropped)   bits 32-47 flags   bits 48-63 AGK_FIN_MARK
//          (0: finalize was never called)
//     +AGK_LANE_WORDS ...  `capacity` records, in the lane's program order
//   record
//     bits 32-63 %globaltimer, low 32 bits (wraps every 4.29 s: the lane's full start stamp resolves it)
//     bits  0-31 tag: bits 0-1 kind, bits 2-13 stage id, bits 14-23 zero, bits 24-31 AGK_RECORD_MARK
#ifndef ASYNCGPU_PROFILE_FORMAT_H
#define ASYNCGPU_PROFILE_FORMAT_H

#define AGK_MAGIC 0x314B4741
#define AGK_HEADER_WORDS 4
#define AGK_LANE_WORDS 3

#define AGK_HDR_MAGIC 0
#define AGK_HDR_GROUPS 1
#define AGK_HDR_LANES 2
#define AGK_HDR_CAPACITY 3
#define AGK_HDR_BLOCKS 4
#define AGK_HDR_NO_ROOM 5
#define AGK_HDR_BAD_GROUP 6

#define AGK_LANE_START 0
#define AGK_LANE_END 1
#define AGK_LANE_FIN 2
#define AGK_FIN_FLAGS_SHIFT 32
#define AGK_FIN_MARK_SHIFT 48
#define AGK_FIN_MARK 0xF1A1
#define AGK_FLAG_REUSED 0x1

#define AGK_TIME_SHIFT 32
#define AGK_KIND_BITS 2
#define AGK_KIND_BEGIN 0
#define AGK_KIND_END 1
#define AGK_KIND_INSTANT 2
#define AGK_STAGE_SHIFT 2
#define AGK_STAGE_BITS 12
#define AGK_MARK_SHIFT 24
#define AGK_RECORD_MARK 0xA5

#endif
