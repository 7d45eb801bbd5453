// The ledger of blocks: which are live, which were freed last, how many bytes each device has
// in use, and the MALLOC, FREE and OWNER rows that tell the runtime about them.

#include "blocks.h"

#include <unordered_map>

namespace msmemscope::capture {

SpinMutex g_mutex;
LiveTable g_live;
uint64_t g_next_aid = 1;

namespace {

constexpr size_t kFreedKept = 4096;
Freed g_freed[kFreedKept];  // a ring: the newest freed blocks
size_t g_freed_next = 0, g_freed_count = 0;

DeviceUse g_cpu_use;
std::unordered_map<uint64_t, DeviceUse> g_use;  // other devices: (kind << 32 | index) -> bytes

// `PTA[@category][@labels]`.
void owner_of(Out& o, const Block& b) {
  o.lit("PTA");
  if (b.category != nullptr) {
    o.lit("@");
    o.text(b.category);
  }
  if (b.labels != nullptr) {
    o.lit("@");
    o.text(b.labels);
  }
}

// The Attr text of a block row; `with_owner` adds the owner (`PTA[@category][@labels]`).
size_t block_attrs(char* buf, size_t cap, const Block& b, uint64_t ptr, uint64_t used,
                   long long total, bool with_owner) {
  Out o{buf, buf + cap - 1};
  o.lit("{\"allocation_id\":");
  o.u64(b.aid);
  o.lit(",\"addr\":\"0x");
  o.hex16(ptr);
  o.lit("\",\"size\":");
  o.u64(b.size);
  if (used != UINT64_MAX) {
    o.lit(",\"used\":");
    o.u64(used);
  }
  if (total >= 0) {
    o.lit(",\"total\":");
    o.u64(uint64_t(total));
  }
  if (with_owner) {
    o.lit(",\"owner\":\"");
    owner_of(o, b);
    o.lit("\"");
  }
  o.lit("}");
  return size_t(o.p - buf);
}

// A MALLOC or FREE row of block `b` at `ptr` (`with_owner`: the owner and site members).
void emit_block(uint32_t event, const Block& b, uint64_t ptr, uint64_t used, long long total,
                bool with_owner, StrRef site, StrRef frame, StrRef op, StrRef module,
                StrRef stack, bool c_stack) {
  if (g_emit_block == nullptr) return;
  uint32_t flags = (c_stack ? kWantCStack : 0u) | (with_owner ? kBlockOwner : 0u);
  if (used != UINT64_MAX) flags |= kBlockUsed;
  if (total >= 0) flags |= kBlockTotal;
  StrRef none{nullptr, 0};
  BlockRecord r{event,
                g_codes.ty_pta,
                b.dev_kind,
                b.dev_index,
                ptr,
                b.aid,
                b.size,
                flags,
                0,
                used,
                total >= 0 ? uint64_t(total) : 0,
                with_owner && b.category != nullptr ? str(*b.category) : none,
                with_owner && b.labels != nullptr ? str(*b.labels) : none,
                site,
                frame,
                op,
                module,
                stack};
  g_emit_block(&r);
}

}  // namespace

DeviceUse& use_of(uint32_t kind, uint32_t index) {
  if (kind == kDeviceCpu) return g_cpu_use;
  return g_use[(uint64_t(kind) << 32) | index];
}

void record_malloc(uint64_t ptr, uint64_t size, uint32_t dev_kind, uint32_t dev_index,
                   uint64_t used, long long total, Text category, bool adopted,
                   const std::string& stack, const Site& site) {
  Block b{g_next_aid++, size, dev_kind, dev_index, adopted, category,
          g_labels.load(std::memory_order_relaxed)};
  DeviceUse& u = use_of(dev_kind, dev_index);
  u.used += size;
  if (u.used > u.peak) u.peak = u.used;
  if (used == UINT64_MAX) used = u.used;
  if (g_cfg.alloc) {
    // The site members: `site` the user's line; `frame` the innermost frame when it is
    // another; `op` the op that allocated.
    StrRef frame = site.inner != nullptr && site.inner != site.user ? str(*site.inner)
                                                                     : StrRef{nullptr, 0};
    StrRef user = site.user != nullptr ? str(*site.user) : StrRef{nullptr, 0};
    // A block made before tracking was not allocated by the module running now.
    StrRef module = site.module != nullptr && !adopted ? str(*site.module) : StrRef{nullptr, 0};
    emit_block(g_codes.ev_malloc, b, ptr, used, total, true, user, frame, site.op, module,
               str(stack), g_cfg.c_stack);
  }
  g_live.put(ptr, b);
}

void record_free(uint64_t ptr, const Block& b, uint64_t used, long long total) {
  DeviceUse& u = use_of(b.dev_kind, b.dev_index);
  u.used = u.used >= b.size ? u.used - b.size : 0;
  if (used == UINT64_MAX) used = u.used;
  g_freed[g_freed_next] = Freed{ptr, b.size, b.dev_kind, b.dev_index};
  g_freed_next = (g_freed_next + 1) % kFreedKept;
  if (g_freed_count < kFreedKept) ++g_freed_count;
  if (g_cfg.free) {
    StrRef none{nullptr, 0};
    emit_block(g_codes.ev_free, b, ptr, used, total, false, none, none, none, none, none,
               false);
  }
  g_live.erase(ptr);
}

bool find_freed(uint64_t addr, Freed* out) {
  for (size_t i = 0; i < g_freed_count; ++i) {
    const Freed& it = g_freed[(g_freed_next + kFreedKept - 1 - i) % kFreedKept];
    if (it.addr <= addr && addr < it.addr + it.size) {
      *out = it;
      return true;
    }
  }
  return false;
}

bool emit_owner_row(uint64_t ptr, const Block& b) {
  if (!g_cfg.alloc) return false;
  char attrs[512];
  size_t n = block_attrs(attrs, sizeof attrs, b, ptr, UINT64_MAX, -1, true);
  char owner[384];
  Out o{owner, owner + sizeof owner};
  owner_of(o, b);
  emit(g_codes.ev_system, g_codes.ty_owner, StrRef{owner, size_t(o.p - owner)}, b.dev_kind,
       b.dev_index, true, ptr, StrRef{attrs, n}, StrRef{nullptr, 0}, false);
  return true;
}

}  // namespace msmemscope::capture
