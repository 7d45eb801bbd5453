// The live blocks: the table of them by address and the lock that guards it (in this header so
// that the table's probes and the lock's fast path are inlined on the program's thread), and
// what blocks.cpp does with them: the rows of blocks, the freed blocks, the bytes in use.

#pragma once

#include <sched.h>
#include <sys/mman.h>
#include <time.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "capture.h"

#pragma GCC visibility push(hidden)

namespace msmemscope::capture {

struct Block {
  uint64_t aid;
  uint64_t size;
  uint32_t dev_kind, dev_index;
  bool adopted;  // made before tracking; its FREE comes from the Python side
  Text category;
  Text labels;  // this block's user labels, "a@b"
};

// The live blocks by address: an open-addressed table (linear probing, removal by shifting
// back, no tombstones) in memory mapped for it. Tracking a block so costs the program's thread
// no malloc and no free (std::unordered_map made a node per block), and puts nothing of ours
// in the program's heap.
class LiveTable {
 public:
  // The live block at `key`, or null.
  Block* find(uint64_t key) {
    if (slots_ == nullptr || key == 0) return nullptr;
    for (size_t i = home(key);; i = (i + 1) & mask()) {
      if (slots_[i].key == key) return &slots_[i].block;
      if (slots_[i].key == 0) return nullptr;
    }
  }

  // Sets the block at `key`; false when no memory could be had for it (it goes untracked).
  bool put(uint64_t key, const Block& b) {
    if (key == 0) return false;
    if ((size_ + 1) * 10 > cap_ * 7 && !grow()) return false;
    size_t i = home(key);
    while (slots_[i].key != 0 && slots_[i].key != key) i = (i + 1) & mask();
    if (slots_[i].key == 0) ++size_;
    slots_[i] = Slot{key, b};
    return true;
  }

  void erase(uint64_t key) {
    if (slots_ == nullptr || key == 0) return;
    size_t i = home(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return;
      i = (i + 1) & mask();
    }
    // Later entries of the run move back into the hole unless they sit at or after their own
    // home position, counted cyclically from the hole.
    for (size_t j = (i + 1) & mask(); slots_[j].key != 0; j = (j + 1) & mask()) {
      size_t h = home(slots_[j].key);
      bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i].key = 0;
    --size_;
  }

  template <typename F>
  void each(F f) const {
    for (size_t i = 0; i < cap_; ++i) {
      if (slots_[i].key != 0) {
        if (!f(slots_[i].key, slots_[i].block)) return;
      }
    }
  }

 private:
  struct Slot {
    uint64_t key;  // the block's address; 0: empty
    Block block;
  };

  size_t mask() const { return cap_ - 1; }
  size_t home(uint64_t key) const {
    return size_t((key * 0x9E3779B97F4A7C15ull) >> (64 - bits_));
  }

  bool grow() {
    int bits = slots_ == nullptr ? 8 : bits_ + 1;
    size_t cap = size_t(1) << bits;
    void* mem = mmap(nullptr, cap * sizeof(Slot), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return false;
    Slot* old = slots_;
    size_t old_cap = cap_;
    slots_ = static_cast<Slot*>(mem);  // zero-filled: every slot empty
    cap_ = cap;
    bits_ = bits;
    size_ = 0;
    for (size_t i = 0; i < old_cap; ++i) {
      if (old[i].key != 0) put(old[i].key, old[i].block);
    }
    if (old != nullptr) munmap(old, old_cap * sizeof(Slot));
    return true;
  }

  Slot* slots_ = nullptr;
  size_t cap_ = 0, size_ = 0;
  int bits_ = 0;
};

// A lock left with a release store. std::mutex leaves with an atomic exchange (it must learn
// whether a waiter sleeps), and each locked instruction is a full fence that makes the
// program's thread wait for its pending stores: two of them per block event cost more than the
// rest of the event. Nobody sleeps on this one: a waiter spins a little, then yields its core,
// then naps; holders keep it for one table update (the API's walks over every live block are
// rare).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class SpinMutex {
 public:
  void lock() {
    if (!locked_.exchange(true, std::memory_order_acquire)) return;
    for (unsigned tries = 0;; ++tries) {
      if (!locked_.load(std::memory_order_relaxed) &&
          !locked_.exchange(true, std::memory_order_acquire)) {
        return;
      }
      if (tries < 128) {
        cpu_relax();
      } else if (tries < 192) {
        sched_yield();
      } else {
        struct timespec nap = {0, 50000};
        nanosleep(&nap, nullptr);
      }
    }
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

// One lock for the table, the counters and the writing of the rows, so that the rows of one
// address are written in the order the allocator reported them, whatever the thread.
extern SpinMutex g_mutex;
extern LiveTable g_live;
extern uint64_t g_next_aid;

// The rest is called with g_mutex held.

struct Freed {
  uint64_t addr, size;
  uint32_t dev_kind, dev_index;
};

// The newest freed block holding `addr`; false when none of the newest few thousand does.
bool find_freed(uint64_t addr, Freed* out);

struct DeviceUse {
  uint64_t used = 0, peak = 0;
};

// The bytes of tracked blocks in use on a device, and their peak.
DeviceUse& use_of(uint32_t kind, uint32_t index);

// A new block at `ptr`: its MALLOC row (`used`: UINT64_MAX when the allocator does not say;
// `total`: -1 likewise) and its place in the table.
void record_malloc(uint64_t ptr, uint64_t size, uint32_t dev_kind, uint32_t dev_index,
                   uint64_t used, long long total, Text category, bool adopted,
                   const std::string& stack, const Site& site);

// `b` is the live block at `ptr`: its FREE row; it leaves the table.
void record_free(uint64_t ptr, const Block& b, uint64_t used, long long total);

// The SYSTEM/OWNER row that moves the live block `b` at `ptr` to its current owner; false when
// rows of blocks are not recorded.
bool emit_owner_row(uint64_t ptr, const Block& b);

}  // namespace msmemscope::capture

#pragma GCC visibility pop
