/* A synthetic memscope dump for bench/offline_analyses.py.
 *
 *   gen_dump ROWS VARIANT OUT.csv [OPS]
 *
 * A CPU training run as the PyTorch tracker writes it: ops (OP_LAUNCH ATEN_START, MALLOC of the
 * op's output, ACCESS WRITE of it, sometimes an ACCESS READ of an older block, ATEN_END), FREEs
 * that keep about ROWS/33 blocks live (a few hundred thousand), a SYSTEM STEP row every 20000
 * ops and three MSTX marks named "bench" at 10%, 50% and 95% of the rows. Every 1000th block
 * allocated between the first two marks is never freed (the leaks check_leaks must find).
 * Op names are drawn at random from 48 ATen names, blocks have unique pointers 1 MiB apart.
 *
 * VARIANT 1 is "a slightly modified copy": the same run (same random streams) with one extra
 * op, aten::native_dropout, every ~ops/10 ops and one op's allocation doubled every ~ops/10
 * ops. With OPS the run stops after OPS ops (give the base's count, so that the copy ends
 * where the base does) instead of at ROWS rows. Prints the numbers of rows, ops, extra ops and
 * doubled ops on stdout.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static const char *NAMES[48] = {
    "aten::addmm.default", "aten::mm.default", "aten::bmm.default", "aten::relu.default",
    "aten::gelu.default", "aten::add.Tensor", "aten::mul.Tensor", "aten::sub.Tensor",
    "aten::div.Tensor", "aten::sum.dim_IntList", "aten::mean.dim", "aten::view.default",
    "aten::t.default", "aten::transpose.int", "aten::clone.default", "aten::_softmax.default",
    "aten::_log_softmax.default", "aten::nll_loss_forward.default", "aten::native_layer_norm.default",
    "aten::embedding.default", "aten::cat.default", "aten::split.Tensor", "aten::empty.memory_format",
    "aten::zeros_like.default", "aten::ones_like.default", "aten::fill_.Scalar", "aten::copy_.default",
    "aten::threshold_backward.default", "aten::gelu_backward.default", "aten::_softmax_backward_data.default",
    "aten::native_layer_norm_backward.default", "aten::embedding_dense_backward.default",
    "aten::nll_loss_backward.default", "aten::_log_softmax_backward_data.default", "aten::expand.default",
    "aten::unsqueeze.default", "aten::squeeze.dim", "aten::permute.default", "aten::reshape.default",
    "aten::addcmul_.default", "aten::addcdiv_.default", "aten::sqrt.default", "aten::pow.Tensor_Scalar",
    "aten::neg.default", "aten::exp.default", "aten::where.self", "aten::masked_fill.Scalar",
    "aten::tanh.default",
};

static FILE *out;
static uint64_t row_id, ts = 1700000000000000000ull, used;

static void row(const char *event, const char *type, const char *name, const char *device,
                uint64_t ptr, const char *attr) {
    row_id++;
    ts += 137;
    char ptrs[24];
    if (ptr)
        snprintf(ptrs, sizeof ptrs, "0x%016" PRIx64, ptr);
    else
        strcpy(ptrs, "N/A");
    fprintf(out, "%" PRIu64 ",%s,%s,%s,%" PRIu64 ",1234,1234,%s,%s,%s,,\n", row_id, event, type,
            name, ts, device, ptrs, attr);
}

#define PTR(b) ((uint64_t)0x100000000 + (uint64_t)(b) * (uint64_t)0x100000)

static uint64_t *sizes;
static uint32_t *live;
static size_t nlive;

static void malloc_row(uint64_t block, uint64_t size) {
    char attr[256];
    used += size;
    snprintf(attr, sizeof attr,
             "\"{\"\"allocation_id\"\":%" PRIu64 ",\"\"addr\"\":%" PRIu64 ",\"\"size\"\":%" PRIu64
             ",\"\"used\"\":%" PRIu64 ",\"\"owner\"\":\"\"PTA@activation\"\"}\"",
             block + 1, PTR(block), size, used);
    row("MALLOC", "PTA", "N/A", "cpu", PTR(block), attr);
}

static void free_row(uint64_t block, uint64_t size) {
    char attr[256];
    used -= size;
    snprintf(attr, sizeof attr,
             "\"{\"\"allocation_id\"\":%" PRIu64 ",\"\"addr\"\":%" PRIu64 ",\"\"size\"\":%" PRIu64
             ",\"\"used\"\":%" PRIu64 "}\"",
             block + 1, PTR(block), size, used);
    row("FREE", "PTA", "N/A", "cpu", PTR(block), attr);
}

static void access_row(const char *type, const char *name, uint64_t block) {
    row("ACCESS", type, name, "cpu", PTR(block),
        "\"{\"\"dtype\"\":\"\"torch.float32\"\",\"\"shape\"\":[64,64]}\"");
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: gen_dump ROWS VARIANT OUT.csv [OPS]\n");
        return 2;
    }
    uint64_t rows = strtoull(argv[1], 0, 10);
    uint64_t ops_limit = argc == 5 ? strtoull(argv[4], 0, 10) : UINT64_MAX;
    int variant = atoi(argv[2]);
    out = fopen(argv[3], "w");
    if (!out) {
        perror(argv[3]);
        return 1;
    }
    static char buf[1 << 22];
    setvbuf(out, buf, _IOFBF, sizeof buf);
    fputs("ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,"
          "Call Stack(Python),Call Stack(C)\n",
          out);
    uint64_t est_ops = rows / 5 + 16;
    uint64_t live_target = rows / 33 + 1;
    sizes = malloc(sizeof *sizes * (est_ops + 64));
    live = malloc(sizeof *live * (est_ops + 64));
    uint64_t marks[3] = {rows / 10, rows / 2, rows - rows / 20};
    int next_mark = 0;
    uint64_t block = 0, op = 0, extra = 0, doubled = 0, extra_block = 0;
    uint64_t period = est_ops / 10 + 1;
    while (ops_limit == UINT64_MAX ? row_id < rows : op < ops_limit) {
        if (next_mark < 3 && row_id >= marks[next_mark]) {
            row("MSTX", "Mark", "bench", "N/A", 0, "{}");
            next_mark++;
        }
        if (op % 20000 == 0 && op) {
            char step[24];
            snprintf(step, sizeof step, "%" PRIu64, op / 20000);
            row("SYSTEM", "STEP", step, "N/A", 0, "{}");
        }
        if (variant == 1 && op % period == period / 2) {
            /* The extra op: allocates a block and drops it right away (own pointer range). */
            const char *name = "aten::native_dropout.default";
            uint64_t b = est_ops + 1000 + extra_block++;
            row("OP_LAUNCH", "ATEN_START", name, "N/A", 0, "{}");
            malloc_row(b, 4096);
            row("OP_LAUNCH", "ATEN_END", name, "N/A", 0, "{}");
            free_row(b, 4096);
            extra++;
        }
        const char *name = NAMES[rnd() % 48];
        uint64_t size = 512 * (1 + rnd() % 128);
        if (variant == 1 && op % period == period / 3) {
            size *= 2;
            doubled++;
        }
        uint64_t read_pick = rnd();
        uint64_t free_pick = rnd();
        sizes[block] = size;
        row("OP_LAUNCH", "ATEN_START", name, "N/A", 0, "{}");
        malloc_row(block, size);
        access_row("WRITE", name, block);
        if (nlive && (read_pick & 1))
            access_row("READ", name, live[(read_pick >> 1) % nlive]);
        row("OP_LAUNCH", "ATEN_END", name, "N/A", 0, "{}");
        int pinned = next_mark == 1 && block % 1000 == 0;
        if (!pinned)
            live[nlive++] = (uint32_t)block;
        if (nlive > live_target) {
            size_t at = free_pick % nlive;
            uint32_t b = live[at];
            live[at] = live[--nlive];
            free_row(b, sizes[b]);
        }
        block++;
        op++;
        if (block >= est_ops + 32)
            break;
    }
    if (fclose(out)) {
        perror(argv[3]);
        return 1;
    }
    printf("%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", row_id, op, extra, doubled);
    return 0;
}
