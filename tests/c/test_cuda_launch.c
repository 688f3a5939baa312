/* test_cuda_launch.c — what can be checked of the CUDA kernels without a GPU:
 *   - the reductions' launch arithmetic (engine/cuda/reduce_plan.h): the ranges of a split
 *     partition the reduced indices exactly (every element summed once, no empty range) for
 *     sizes from 1 to past 2^31, the thread loops inside a range cover it exactly, the grid
 *     strides over every (unit, range) pair once, both stages of a launch run on the host with
 *     the kernels' own index helpers give exact sums (each partial slot written and read once),
 *     splits fill the GPU when there is work for it,
 *     dim merging keeps every element's offset, and the form chosen for the shapes that matter
 *     (full sum, row sum, bias gradient) is the coalesced one;
 *   - a source rule of engine/cuda/<file>.cu: a kernel that draws random numbers reads its Philox key
 *     with kg_rng_load (a kg_cuda_rng), never as a (seed, offset) passed by value, which CUDA
 *     Graph capture would bake into the graph so that every replay drew the same numbers;
 *   - topk's bitonic network (engine/cuda/topk_plan.h), run step by step as the kernels run it
 *     (shared memory for short rows, a launch per step for long ones), sorts rows with NaNs, ties
 *     and padding exactly as qsort orders them by the same (value, index) order;
 *   - source rules of every engine/cuda/ source (.cu, .cuh) and engine/dist/nccl.cu: every kernel launch names a
 *     stream (`<<<grid, block, smem, stream>>>`: a launch without one goes to the legacy default
 *     stream, which is not ordered with keng's non-blocking compute stream), and no synchronous
 *     cudaMemcpy / cudaMemset / cudaDeviceSynchronize (also legacy-stream operations: unordered
 *     with that stream, and illegal while it is being captured).
 * Run: ctest -R test_cuda_launch; exits non-zero when a check fails. */
#include "cuda/reduce_plan.h"
#include "cuda/topk_plan.h"

#include <math.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int checks, failures;
#define CHECKM(cond, ...)                                               \
  do {                                                                  \
    checks++;                                                           \
    if (!(cond)) {                                                      \
      failures++;                                                       \
      fprintf(stderr, "%s:%d: FAILED: %s ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                     \
      fputc('\n', stderr);                                              \
    }                                                                   \
  } while (0)

/* ---- splits ------------------------------------------------------------------------------- */

static const int64_t sizes[] = {1, 2, 31, 255, 256, 257, 2047, 2048, 2049, 4096, 65537, 1000000,
                                (int64_t)1 << 31, ((int64_t)1 << 31) + 1, ((int64_t)1 << 40) + 3};
static const int64_t unit_counts[] = {1, 2, 3, 16, 255, 1023, 1024, 1025, 4096, 1000000, (int64_t)1 << 32};
static const int64_t min_chunks[] = {KG_RED_MIN_CHUNK_ROWS, KG_RED_MIN_CHUNK_COLS, 1};

/* the ranges of p partition [0, n): consecutive, non-empty, ending at n */
static void check_partition(kg_split p, int64_t units, int64_t n, int64_t min_chunk) {
  CHECKM(p.splits >= 1 && p.splits <= KG_RED_MAX_SPLITS, "units %lld n %lld: %lld splits", (long long)units,
         (long long)n, (long long)p.splits);
  int64_t at = 0;
  for (int64_t k = 0; k < p.splits; k++) {
    int64_t lo, hi;
    kg_split_range(p, n, k, &lo, &hi);
    if (lo != at || hi <= lo) {
      CHECKM(0, "units %lld n %lld: range %lld is [%lld, %lld), expected to start at %lld and be non-empty",
             (long long)units, (long long)n, (long long)k, (long long)lo, (long long)hi, (long long)at);
      return;
    }
    at = hi;
  }
  CHECKM(at == n, "units %lld n %lld: the ranges end at %lld", (long long)units, (long long)n, (long long)at);
  if (p.splits > 1) CHECKM(p.chunk >= min_chunk, "chunk %lld < %lld", (long long)p.chunk, (long long)min_chunk);
  /* enough blocks when the work allows: the target, or as many ranges as min_chunk permits */
  int64_t most = n / min_chunk < KG_RED_MAX_SPLITS ? n / min_chunk : KG_RED_MAX_SPLITS;
  int64_t want = units >= KG_RED_TARGET_BLOCKS ? units : units * (most < 1 ? 1 : most);
  if (want > KG_RED_TARGET_BLOCKS && units < KG_RED_TARGET_BLOCKS) want = KG_RED_TARGET_BLOCKS;
  CHECKM(units * p.splits >= want / 2, "units %lld n %lld: only %lld blocks (want %lld)", (long long)units,
         (long long)n, (long long)(units * p.splits), (long long)want);
}

/* the kernels' loops, run on the host for small n: block-per-output threads stride by the
 * block inside each range, thread-per-output threads walk the range; each index once */
static void check_loops(kg_split p, int64_t n) {
  unsigned char *seen = calloc((size_t)n, 1);
  for (int64_t k = 0; k < p.splits; k++) {
    int64_t lo, hi;
    kg_split_range(p, n, k, &lo, &hi);
    for (int t = 0; t < 256; t++)
      for (int64_t r = lo + t; r < hi; r += 256) seen[r]++;
  }
  int64_t bad = -1;
  for (int64_t i = 0; i < n && bad < 0; i++)
    if (seen[i] != 1) bad = i;
  CHECKM(bad < 0, "n %lld: element %lld summed %d times", (long long)n, (long long)bad, bad < 0 ? 1 : seen[bad]);
  free(seen);
}

static void test_splits(void) {
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
    for (size_t j = 0; j < sizeof unit_counts / sizeof *unit_counts; j++)
      for (size_t m = 0; m < sizeof min_chunks / sizeof *min_chunks; m++) {
        kg_split p = kg_split_plan(unit_counts[j], sizes[i], min_chunks[m]);
        check_partition(p, unit_counts[j], sizes[i], min_chunks[m]);
        if (sizes[i] <= 65537) check_loops(p, sizes[i]);
      }
  /* nothing to reduce: one empty range (outputs are zeros) */
  kg_split z = kg_split_plan(5, 0, 32);
  CHECKM(z.splits == 1 && z.chunk == 0, "n 0: %lld splits of %lld", (long long)z.splits, (long long)z.chunk);
  /* the shapes of the issue: a full sum of 10^6 spreads over hundreds of blocks, not one */
  kg_split full = kg_split_plan(1, 1000000, KG_RED_MIN_CHUNK_ROWS);
  CHECKM(full.splits >= 400, "full sum of 1e6: %lld blocks", (long long)full.splits);
  /* a bias gradient dy [8192, 4096] -> [4096]: 16 tiles, each split into row ranges */
  kg_split bias = kg_split_plan(4096 / KG_RED_TILE, 8192, KG_RED_MIN_CHUNK_COLS);
  CHECKM(16 * bias.splits >= 1000, "bias grad [8192, 4096]: %lld blocks", (long long)(16 * bias.splits));
}

/* Both stages of a launch run on the host with the kernels' index arithmetic (blocks and threads
 * as loops): x[o][r] = o * 7 + r % 5 + 1 summed over r must come out exactly, every partial slot
 * written once by stage 1 and read once by stage 2. nvals 2 is norm.cu's dw/db: two sums per
 * (output, range), placed by kg_red_part2. */
static void check_launch(int64_t nout, int64_t n, bool rows, int nvals) {
  int64_t units = rows ? nout : (nout + KG_RED_TILE - 1) / KG_RED_TILE;
  kg_split sp = kg_split_plan(units, n, rows ? KG_RED_MIN_CHUNK_ROWS : KG_RED_MIN_CHUNK_COLS);
  int64_t pairs = units * sp.splits, slots = nout * sp.splits * nvals;
  double *part = calloc((size_t)slots, sizeof(double)), *out = calloc((size_t)(nout * nvals), sizeof(double));
  unsigned char *written = calloc((size_t)slots, 1), *read = calloc((size_t)slots, 1);
  unsigned grid = kg_red_grid(pairs);
  bool ok = true;
  for (unsigned b = 0; b < grid; b++)
    for (int64_t u = b; u < pairs; u += grid) {
      if (rows) {
        int64_t o, k, lo, hi;
        kg_red_rows_pair(u, sp, &o, &k);
        if (o < 0 || o >= nout || k < 0 || k >= sp.splits) {
          ok = false;
          continue;
        }
        kg_split_range(sp, n, k, &lo, &hi);
        double acc = 0;
        for (int t = 0; t < 256; t++)
          for (int64_t r = lo + t; r < hi; r += 256) acc += (double)(o * 7 + r % 5 + 1);
        for (int j = 0; j < nvals; j++) {
          if (sp.splits == 1) {
            out[j * nout + o] = acc;
            continue;
          }
          int64_t at = nvals == 2 ? kg_red_part2(true, sp, nout, o, k, j) : kg_red_part(true, sp, nout, o, k);
          ok = ok && at >= 0 && at < slots && !written[at];
          if (at >= 0 && at < slots) part[at] = acc, written[at]++;
        }
        continue;
      }
      for (int i = 0; i < KG_RED_TILE; i++) {
        int64_t o, k, lo, hi;
        kg_red_cols_pair(u, units, i, &o, &k);
        if (o < 0 || k < 0 || k >= sp.splits) ok = false;
        if (o < 0 || o >= nout || !ok) continue;
        kg_split_range(sp, n, k, &lo, &hi);
        double acc = 0;
        for (int64_t r = lo; r < hi; r++) acc += (double)(o * 7 + r % 5 + 1);
        for (int j = 0; j < nvals; j++) {
          if (sp.splits == 1) {
            out[j * nout + o] = acc;
            continue;
          }
          int64_t at = nvals == 2 ? kg_red_part2(false, sp, nout, o, k, j) : kg_red_part(false, sp, nout, o, k);
          ok = ok && at >= 0 && at < slots && !written[at];
          if (at >= 0 && at < slots) part[at] = acc, written[at]++;
        }
      }
    }
  if (sp.splits > 1)
    for (int64_t o = 0; o < nout; o++)
      for (int j = 0; j < nvals; j++) {
        double acc = 0;
        for (int64_t k = 0; k < sp.splits; k++) {
          int64_t at = nvals == 2 ? kg_red_part2(rows, sp, nout, o, k, j) : kg_red_part(rows, sp, nout, o, k);
          ok = ok && at >= 0 && at < slots && written[at] && !read[at];
          if (at >= 0 && at < slots) acc += part[at], read[at]++;
        }
        out[j * nout + o] = acc;
      }
  int64_t bad = -1;
  for (int64_t o = 0; o < nout && bad < 0; o++) {
    double want = 0;
    for (int64_t r = 0; r < n; r++) want += (double)(o * 7 + r % 5 + 1);
    for (int j = 0; j < nvals; j++)
      if (out[j * nout + o] != want) bad = o;
  }
  CHECKM(ok && bad < 0, "%s nout %lld n %lld (x%d): %lld ranges; slots ok %d, first wrong output %lld",
         rows ? "block per output" : "thread per output", (long long)nout, (long long)n, nvals,
         (long long)sp.splits, ok, (long long)bad);
  free(part), free(out), free(written), free(read);
}

static void test_launches(void) {
  const int64_t nouts[] = {1, 2, 3, 31, 255, 256, 257, 1000};
  const int64_t ns[] = {0, 1, 255, 256, 257, 2049, 65537, 300000};
  for (size_t i = 0; i < sizeof nouts / sizeof *nouts; i++)
    for (size_t j = 0; j < sizeof ns / sizeof *ns; j++) {
      if (nouts[i] * ns[j] > 3000000) continue;
      check_launch(nouts[i], ns[j], true, 1);
      check_launch(nouts[i], ns[j], true, 2);
      check_launch(nouts[i], ns[j], false, 1);
      check_launch(nouts[i], ns[j], false, 2);
    }
  check_launch(4096, 700, false, 2); /* many tiles, few rows each */
}

/* ---- the grid ----------------------------------------------------------------------------- */

static void test_grid(void) {
  const int64_t pairs[] = {0, 1, 255, 65535, 65536, 200001, (int64_t)1 << 33};
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
    unsigned g = kg_red_grid(pairs[i]);
    CHECKM(g >= 1 && g <= KG_RED_MAX_GRID, "pairs %lld: grid %u", (long long)pairs[i], g);
    CHECKM(pairs[i] <= KG_RED_MAX_GRID ? g == (pairs[i] < 1 ? 1u : (unsigned)pairs[i]) : g == KG_RED_MAX_GRID,
           "pairs %lld: grid %u", (long long)pairs[i], g);
    if (pairs[i] <= 200001) { /* the kernels' `for (u = blockIdx.x; u < pairs; u += gridDim.x)` */
      int64_t visits = 0;
      for (unsigned b = 0; b < g; b++)
        for (int64_t u = b; u < pairs[i]; u += g) visits++;
      CHECKM(visits == pairs[i], "pairs %lld: %lld visits", (long long)pairs[i], (long long)visits);
    }
  }
}

/* ---- dim merging ---------------------------------------------------------------------------- */

static int64_t offset_of(int n, const int64_t *shape, const int64_t *stride, int64_t i) {
  int64_t off = 0;
  for (int d = n - 1; d >= 0; d--) {
    off += (i % shape[d]) * stride[d];
    i /= shape[d];
  }
  return off;
}

static void check_merge(int n, const int64_t *shape, const int64_t *stride, int want_dims) {
  int64_t s2[8], st2[8], count = 1;
  memcpy(s2, shape, sizeof(int64_t) * (size_t)n);
  memcpy(st2, stride, sizeof(int64_t) * (size_t)n);
  for (int d = 0; d < n; d++) count *= shape[d];
  int m = kg_red_merge(n, s2, st2);
  CHECKM(m == want_dims, "merged %d dims into %d, expected %d", n, m, want_dims);
  int64_t c2 = 1;
  for (int d = 0; d < m; d++) c2 *= s2[d];
  CHECKM(c2 == count, "%lld elements became %lld", (long long)count, (long long)c2);
  for (int64_t i = 0; i < count; i++)
    if (offset_of(n, shape, stride, i) != offset_of(m, s2, st2, i)) {
      CHECKM(0, "element %lld: offset %lld became %lld", (long long)i, (long long)offset_of(n, shape, stride, i),
             (long long)offset_of(m, s2, st2, i));
      return;
    }
}

static void test_merge(void) {
  check_merge(3, (int64_t[]){2, 3, 4}, (int64_t[]){12, 4, 1}, 1);      /* contiguous: one dim */
  check_merge(3, (int64_t[]){2, 1, 4}, (int64_t[]){4, 99, 1}, 1);      /* a size-1 dim with any stride */
  check_merge(2, (int64_t[]){3, 4}, (int64_t[]){1, 3}, 2);             /* transposed: kept apart */
  check_merge(3, (int64_t[]){2, 3, 4}, (int64_t[]){24, 8, 1}, 2);      /* a row pitch: rows merge, not cols */
  check_merge(3, (int64_t[]){4, 5, 6}, (int64_t[]){30, 6, 1}, 1);
  check_merge(3, (int64_t[]){4, 5, 6}, (int64_t[]){1, 24, 4}, 2);      /* a permuted view */
  check_merge(2, (int64_t[]){1, 1}, (int64_t[]){7, 7}, 0);             /* all size 1: a scalar */
  check_merge(3, (int64_t[]){2, 3, 2}, (int64_t[]){0, 2, 1}, 2);       /* a broadcast (stride 0) dim */
}

/* ---- the form ------------------------------------------------------------------------------- */

static void test_form(void) {
  CHECKM(kg_red_block_per_output(1, 1000000, 1, 0), "%s", "full sum");
  CHECKM(kg_red_block_per_output(1000, 4096, 1, 4096), "%s", "row sum");
  CHECKM(!kg_red_block_per_output(4096, 8192, 4096, 1), "%s", "bias grad [8192, 4096]: a column sum");
  CHECKM(!kg_red_block_per_output(768, 16384, 768, 1), "%s", "bias grad [16384, 768]: a column sum");
  CHECKM(!kg_red_block_per_output(1000000, 2, 1, 2), "%s", "many short rows: a thread each");
  CHECKM(kg_red_block_per_output(4, 100000, 4, 1), "%s", "few columns: a block each");
  CHECKM(!kg_red_block_per_output(100, 1, 1, 1), "%s", "nothing to reduce: a copy");
}

/* ---- the random kernels' key ---------------------------------------------------------------- */

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  size_t got = fread(s, 1, (size_t)n, f);
  s[got] = 0;
  fclose(f);
  return s;
}

/* the end of the bracketed text starting at s (*s is open), or NULL */
static const char *match(const char *s, char open, char close) {
  int depth = 0;
  for (; *s; s++) {
    if (*s == open) depth++;
    else if (*s == close && --depth == 0) return s;
  }
  return NULL;
}

static bool contains(const char *lo, const char *hi, const char *needle) {
  size_t n = strlen(needle);
  for (const char *p = lo; p + n <= hi; p++)
    if (!memcmp(p, needle, n)) return true;
  return false;
}

/* every __global__ kernel of one file: a kernel that uses a seed takes a kg_cuda_rng and reads
 * it with kg_rng_load; none takes a raw `uint64_t seed` (runtime.cu's rng_set_kernel, which
 * writes the key buffer, is the one exception). Returns the violations (printed when `say`);
 * *random counts the kernels that draw random numbers. */
static int check_rng_file(const char *name, const char *src, int *random, bool say) {
  int bad = 0;
  for (const char *p = strstr(src, "__global__"); p; p = strstr(p + 1, "__global__")) {
    const char *open = strchr(p, '(');
    const char *close = open ? match(open, '(', ')') : NULL;
    const char *body = close ? strchr(close, '{') : NULL;
    const char *end = body ? match(body, '{', '}') : NULL;
    if (!end) break;
    const char *nm = open, *nb;
    while (nm > p && nm[-1] == ' ') nm--;
    for (nb = nm; nb > p && (nb[-1] == '_' || (nb[-1] >= 'a' && nb[-1] <= 'z') || (nb[-1] >= '0' && nb[-1] <= '9'));)
      nb--;
    int len = (int)(nm - nb);
    if (len == 14 && !memcmp(nb, "rng_set_kernel", 14)) continue;
    const char *why = NULL;
    if (contains(open, close, "uint64_t seed"))
      why = "takes a raw uint64_t seed: pass a kg_cuda_rng (kg_cuda_rng_key) and read it with kg_rng_load";
    if (contains(body, end, "seed") || contains(body, end, "kg_philox_word")) {
      ++*random;
      if (!why && !(contains(open, close, "kg_cuda_rng") && contains(body, end, "kg_rng_load")))
        why = "draws random numbers without reading its key through kg_rng_load";
    }
    if (why) {
      bad++;
      if (say) fprintf(stderr, "%s: %.*s %s\n", name, len, nb, why);
    }
  }
  return bad;
}

static void test_rng_sources(void) {
  const char *files[] = {"creation.cu", "random.cu", "attention.cu", "runtime.cu"};
  int random = 0;
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/engine/cuda/%s", KENG_SOURCE_DIR, files[i]);
    char *src = slurp(path);
    CHECKM(src != NULL, "cannot read %s", path);
    if (!src) continue;
    int bad = check_rng_file(files[i], src, &random, true);
    CHECKM(bad == 0, "%s: %d random kernel(s) whose key a CUDA Graph replay would not renew", files[i], bad);
    free(src);
  }
  CHECKM(random >= 4, "found %d random kernels (random_kernel, dropout, multinomial's two)", random);
  /* the rule catches the defect it is for, and passes the form it asks for */
  int n = 0;
  CHECKM(check_rng_file("",
                        "__global__ void draw(const double *w, uint64_t seed, uint64_t offset) "
                        "{ kg_philox_word(seed, offset, 0); }",
                        &n, false) == 1,
         "%s", "a by-value key passed");
  CHECKM(check_rng_file("",
                        "template <class T> __global__ void d(T *y, kg_cuda_rng rng) { uint64_t seed, offset; "
                        "kg_rng_load(rng, seed, offset); y[0] = kg_philox_word(seed, offset, 0); }",
                        &n, false) == 0,
         "%s", "a kg_cuda_rng key refused");
}

/* ---- topk's sorting network ------------------------------------------------------------------ */

static bool qsort_largest;
static int cmp_item(const void *a, const void *b) {
  const kg_topk_item *x = a, *y = b;
  return kg_topk_before(x, y, qsort_largest) ? -1 : kg_topk_before(y, x, qsort_largest) ? 1 : 0;
}

static void test_topk_network(void) {
  static const int64_t ns[] = {1, 2, 3, 31, 32, 33, 100, 1000, 2047, 2048, 2049, 5000, 70000};
  uint64_t rng = 12345;
  for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
    for (int largest = 0; largest < 2; largest++) {
      int64_t n = ns[a], npad = kg_topk_pad(n);
      CHECKM(npad >= n && npad >= 32 && (npad & (npad - 1)) == 0 && (npad == 32 || npad / 2 < n), "pad of %lld: %lld",
             (long long)n, (long long)npad);
      kg_topk_item *row = malloc(sizeof *row * (size_t)npad), *want = malloc(sizeof *want * (size_t)n);
      for (int64_t j = 0; j < npad; j++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        int r = (int)(rng >> 33) % 50; /* few distinct values: many ties; some NaN, some -inf */
        double v = r == 0 ? NAN : r == 1 ? -INFINITY : (double)(r % 17) - 8;
        row[j] = j < n ? (kg_topk_item){v, j} : (kg_topk_item){0, -1};
      }
      memcpy(want, row, sizeof *want * (size_t)n);
      qsort_largest = largest;
      qsort(want, (size_t)n, sizeof *want, cmp_item);
      /* the steps of both kernels: every (size, stride), every compare-exchange t < npad / 2 */
      for (int64_t size = 2; size <= npad; size <<= 1)
        for (int64_t stride = size >> 1; stride > 0; stride >>= 1)
          for (int64_t t = 0; t < npad / 2; t++) kg_bitonic_exchange(row, t, size, stride, largest != 0);
      int64_t bad = -1;
      for (int64_t j = 0; j < n && bad < 0; j++)
        if (row[j].i != want[j].i) bad = j;
      CHECKM(bad < 0, "n %lld %s: position %lld holds index %lld, qsort has %lld", (long long)n,
             largest ? "largest" : "smallest", (long long)bad, bad < 0 ? 0LL : row[bad].i, bad < 0 ? 0LL : want[bad].i);
      for (int64_t j = n; j < npad; j++) CHECKM(row[j].i == -1, "n %lld: padding not last", (long long)n);
      free(row);
      free(want);
    }
  /* which rows sort in global memory: long ones asking for many items (top_p over a vocabulary) */
  CHECKM(!kg_topk_global_sort(2048, 2048), "%s", "a 2048 row sorts in shared memory");
  CHECKM(!kg_topk_global_sort(256000, 50), "%s", "top_k 50 of 256000: selection passes");
  CHECKM(kg_topk_global_sort(256000, 256000), "%s", "top_p of 256000: a global sort, not 256000 passes");
  CHECKM(kg_topk_global_sort(2049, 65), "%s", "k 65 of 2049: a global sort");
}

/* ---- streams: no launch or copy on the legacy default stream --------------------------------- */

/* the violations of one file's text (printed when `say`): launches whose <<< >>> holds fewer than
 * four arguments, and calls of the synchronous legacy-stream API */
static int check_stream_file(const char *name, const char *src, bool say) {
  int bad = 0;
  for (const char *p = strstr(src, "<<<"); p; p = strstr(p + 3, "<<<")) {
    const char *end = strstr(p + 3, ">>>");
    if (!end) break;
    int commas = 0, depth = 0;
    for (const char *q = p + 3; q < end; q++) {
      if (*q == '(' || *q == '[' || *q == '{') depth++;
      else if (*q == ')' || *q == ']' || *q == '}') depth--;
      else if (*q == ',' && depth == 0) commas++;
    }
    if (commas < 3) {
      bad++;
      if (say) fprintf(stderr, "%s: a launch without a stream: %.*s\n", name, (int)(end + 3 - p), p);
    }
  }
  static const char *banned[] = {"cudaMemcpy(", "cudaMemset(", "cudaDeviceSynchronize(", "cudaMemcpyToSymbol("};
  for (size_t i = 0; i < sizeof banned / sizeof *banned; i++)
    for (const char *p = strstr(src, banned[i]); p; p = strstr(p + 1, banned[i])) {
      bad++;
      if (say) fprintf(stderr, "%s: %.*s on the legacy default stream\n", name, (int)strlen(banned[i]) - 1, banned[i]);
    }
  return bad;
}

static void test_stream_sources(void) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/engine/cuda", KENG_SOURCE_DIR);
  DIR *d = opendir(dir);
  CHECKM(d != NULL, "cannot list %s", dir);
  if (!d) return;
  int files = 0;
  for (struct dirent *e; (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    bool cu = n > 3 && !strcmp(e->d_name + n - 3, ".cu"), cuh = n > 4 && !strcmp(e->d_name + n - 4, ".cuh");
    if (!cu && !cuh) continue;
    char path[1300];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    char *src = slurp(path);
    CHECKM(src != NULL, "cannot read %s", path);
    if (!src) continue;
    files++;
    CHECKM(check_stream_file(e->d_name, src, true) == 0, "%s: launches or copies on the legacy default stream", e->d_name);
    free(src);
  }
  closedir(d);
  CHECKM(files >= 15, "found only %d CUDA sources in %s", files, dir);
  char path[1300];
  snprintf(path, sizeof path, "%s/engine/dist/nccl.cu", KENG_SOURCE_DIR);
  char *src = slurp(path);
  CHECKM(src != NULL, "cannot read %s", path);
  if (src) CHECKM(check_stream_file("nccl.cu", src, true) == 0, "%s", "nccl.cu: the legacy default stream");
  free(src);
  /* the rule catches what it is for, and passes the forms it asks for */
  CHECKM(check_stream_file("", "k<<<kg_grid(n), 256>>>(a); cudaMemcpy(d, s, n, cudaMemcpyHostToDevice);", false) == 2,
         "%s", "a launch without a stream and a synchronous copy not both caught");
  CHECKM(check_stream_file("", "k<<<f(a, b), 256, 0, s>>>(a); cudaMemcpyAsync(d, s, n, k, st);", false) == 0,
         "%s", "a launch with a stream, or an async copy, refused");
}

int main(void) {
  test_splits();
  test_launches();
  test_grid();
  test_merge();
  test_form();
  test_rng_sources();
  test_stream_sources();
  test_topk_network();
  printf("test_cuda_launch: %d checks, %d failed\n", checks, failures);
  return failures != 0;
}
