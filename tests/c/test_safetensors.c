/* test_safetensors.c — fuzz-style smoke test of the safetensors reader (engine/io): a valid
 * file written by kg_safetensors_save is mutated a few thousand times (bit flips, JSON-ish bytes,
 * digit edits in the header, truncation, splices, header-length edits) and every mutant goes
 * through kg_safetensors_parse (and a share through kg_safetensors_load, the mmap path). Each
 * must either fail with a "load: <label>: ..." message or yield tensors whose bytes can all be
 * read. Also checks the unmutated file round-trips exactly. Seeded PRNG: runs are repeatable.
 * Run under -DKENG_SANITIZE=address,undefined to turn silent corruption into failures. */
#include <keng/keng.h>

#include "mutate.h"

#include <unistd.h>

/* reads every byte of every tensor (so a bad pointer or length would fault here) */
static unsigned touch(const kg_tensor_dict *d) {
  unsigned acc = 0;
  for (int i = 0; i < d->n; i++) {
    const kg_tensor *t = d->tensors[i];
    const unsigned char *p = kg_data(t);
    size_t nb = (size_t)kg_numel(t) * kg_elem_size(t);
    for (size_t k = 0; k < nb; k++)
      acc += p[k];
    acc += (unsigned)strlen(d->names[i]);
  }
  for (int i = 0; i < d->nmeta; i++)
    acc += (unsigned)strlen(d->meta_keys[i]) + (unsigned)strlen(d->meta_values[i]);
  return acc;
}

static const char json_bytes[] = "{}[]\",:0123456789-.eE \\u\x80\xff";

static size_t mutate(unsigned char *buf, size_t len, size_t cap, size_t hlen) {
  int rounds = 1 + (int)below(4);
  for (int r = 0; r < rounds; r++) {
    size_t hdr_end = 8 + hlen < len ? 8 + hlen : len;
    switch (below(8)) {
    case 0: /* flip a bit anywhere */ len = mut_flip_bit(buf, len); break;
    case 1: /* a JSON-significant byte inside the header */
      if (hdr_end > 8) buf[8 + below(hdr_end - 8)] = (unsigned char)json_bytes[below(sizeof json_bytes - 1)];
      break;
    case 2: { /* change a digit in the header: offsets and shapes */
      size_t tries = 64;
      while (tries-- && hdr_end > 8) {
        size_t at = 8 + below(hdr_end - 8);
        if (buf[at] >= '0' && buf[at] <= '9') {
          buf[at] = (unsigned char)('0' + below(10));
          break;
        }
      }
      break;
    }
    case 3: len = mut_truncate(len); break;
    case 4: /* edit the header length */
      if (len >= 8) {
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--)
          n = (n << 8) | buf[i];
        uint64_t choices[] = {n + 1, n - 1, n + below(16), n - below(16), next(), (uint64_t)len, 100000001ull, 0};
        n = choices[below(8)];
        for (int i = 0; i < 8; i++)
          buf[i] = (unsigned char)(n >> (8 * i));
      }
      break;
    case 5: len = mut_copy_span(buf, len, 0, 16); break;
    case 6: { /* insert random bytes */
      size_t n = 1 + below(4), at = below(len + 1);
      if (len + n > cap) break;
      memmove(buf + at + n, buf + at, len - at);
      for (size_t k = 0; k < n; k++)
        buf[at + k] = (unsigned char)next();
      len += n;
      break;
    }
    case 7: len = mut_delete_span(buf, len, 8); break;
    }
  }
  return len;
}

/* kg_path_escapes: a file in a model directory must resolve inside it; in a Hugging Face cache
 * snapshot (<repo>/snapshots/<rev>/ or one subfolder of it) inside <repo>/ */
static void test_path_escapes(void) {
  char top[] = "/tmp/keng_st_links_XXXXXX";
  if (!mkdtemp(top)) {
    CHECK(0, "mkdtemp");
    return;
  }
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "cd %s && mkdir -p repo/blobs repo/snapshots/r1/sub/deep plain other && touch repo/blobs/b other/f && "
           "ln -s ../../blobs/b repo/snapshots/r1/a && ln -s ../../../blobs/b repo/snapshots/r1/sub/a && "
           "ln -s ../../../../blobs/b repo/snapshots/r1/sub/deep/a && ln -s ../other/f plain/a && touch plain/b",
           top);
  CHECK(system(cmd) == 0, "could not build %s", top);
  static const struct {
    const char *dir;
    bool escapes;
  } cases[] = {{"repo/snapshots/r1", false},
               {"repo/snapshots/r1/sub", false},
               {"repo/snapshots/r1/sub/deep", true},
               {"plain", true}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char dir[512], file[600];
    snprintf(dir, sizeof dir, "%s/%s", top, cases[i].dir);
    snprintf(file, sizeof file, "%s/a", dir);
    char *real = NULL, *root = NULL;
    bool out = kg_path_escapes(dir, file, &real, &root);
    CHECK(out == cases[i].escapes, "%s/a: escapes %d, expected %d", cases[i].dir, out, cases[i].escapes);
    CHECK(!out == !real && !out == !root, "%s: real/root set only when it escapes", cases[i].dir);
    free(real);
    free(root);
  }
  char dir[512], file[600], *real = NULL, *root = NULL;
  snprintf(dir, sizeof dir, "%s/plain", top);
  snprintf(file, sizeof file, "%s/plain/b", top);
  CHECK(!kg_path_escapes(dir, file, &real, &root), "a plain file inside escapes");
  snprintf(file, sizeof file, "%s/plain/missing", top);
  CHECK(!kg_path_escapes(dir, file, &real, &root) && !real && !root, "a missing file escapes");
  snprintf(cmd, sizeof cmd, "rm -rf %s", top);
  CHECK(system(cmd) == 0, "rm");
}

int main(void) {
  test_path_escapes();
  char dir[] = "/tmp/keng_st_fuzz_XXXXXX";
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  char path[256], mpath[256];
  snprintf(path, sizeof path, "%s/seed.safetensors", dir);
  snprintf(mpath, sizeof mpath, "%s/mutant.safetensors", dir);

  /* the seed file: several dtypes, a 0-d and an empty tensor, metadata */
  kg_tensor_dict d = {0};
  int64_t s23[2] = {2, 3}, s4[1] = {4}, s0[2] = {0, 5};
  kg_tensor *a, *b, *c, *e, *z;
  kg_arange(&a, 0, 6, 1, KG_F32, KG_CPU);
  kg_tensor *a2;
  kg_reshape(&a2, a, 2, s23);
  kg_full(&b, 1, s4, -3.5, KG_BF16, KG_CPU);
  kg_full(&c, 1, s4, 7, KG_I64, KG_CPU);
  kg_full(&e, 0, NULL, 1, KG_BOOL, KG_CPU);
  kg_full(&z, 2, s0, 0, KG_F16, KG_CPU);
  kg_tensor_dict_add(&d, "layer.weight", a2);
  kg_tensor_dict_add(&d, "layer.bias", b);
  kg_tensor_dict_add(&d, "ids", c);
  kg_tensor_dict_add(&d, "flag", e);
  kg_tensor_dict_add(&d, "nothing", z);
  kg_tensor_dict_add_meta(&d, "format", "pt");
  kg_tensor_dict_add_meta(&d, "note", "quote \" and \xc3\xa9");
  kg_tensor *all[] = {a, a2, b, c, e, z};
  for (int i = 0; i < 6; i++)
    kg_tensor_release(all[i]);
  kg_status s = kg_safetensors_save(path, &d);
  CHECK(s == KG_OK, "save: %s", kg_last_error());

  size_t len = 0;
  unsigned char *seed = read_all(path, &len);
  CHECK(seed && len > 8, "seed file missing");
  if (!seed) return 1;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--)
    hlen = (hlen << 8) | seed[i];

  /* the unmutated file round-trips: names, shapes and bytes */
  kg_tensor_dict back = {0};
  s = kg_safetensors_load(&back, path);
  CHECK(s == KG_OK, "load: %s", kg_last_error());
  CHECK(back.n == d.n && back.nmeta == 2, "n %d, nmeta %d", back.n, back.nmeta);
  for (int i = 0; i < d.n && s == KG_OK; i++) {
    int j = 0;
    while (j < back.n && strcmp(back.names[j], d.names[i]))
      j++;
    CHECK(j < back.n, "tensor %s lost", d.names[i]);
    if (j == back.n) continue;
    const kg_tensor *x = d.tensors[i], *y = back.tensors[j];
    CHECK(x->dtype == y->dtype && kg_same_shape(x, y), "%s: dtype or shape differs", d.names[i]);
    size_t nb = (size_t)kg_numel(x) * kg_elem_size(x);
    CHECK(!nb || !memcmp(kg_data(x), kg_data(y), nb), "%s: bytes differ", d.names[i]);
  }
  kg_tensor_dict_free(&back);
  kg_tensor_dict_free(&d);

  /* mutants */
  size_t cap = len + 64;
  unsigned char *buf = malloc(cap);
  int accepted = 0, rejected = 0, bad_messages = 0;
  unsigned sink = 0;
  const int N = 4000, FILE_EVERY = 16;
  for (int it = 0; it < N; it++) {
    memcpy(buf, seed, len);
    size_t n = mutate(buf, len, cap, hlen);
    /* the parser gets an exactly-sized heap copy, so reading one byte past the end is caught by ASan */
    unsigned char *exact = malloc(n ? n : 1);
    memcpy(exact, buf, n);
    kg_tensor_dict m = {0};
    s = kg_safetensors_parse(&m, exact, n, "fuzz");
    if (s == KG_OK) {
      accepted++;
      sink += touch(&m);
    } else {
      rejected++;
      if (strncmp(kg_last_error(), "load: fuzz: ", 12)) {
        if (bad_messages++ < 5) fprintf(stderr, "unexpected message: %s\n", kg_last_error());
      }
      CHECK(m.n == 0 && m.tensors == NULL, "a failed parse left tensors behind");
    }
    kg_tensor_dict_free(&m);
    free(exact);
    if (it % FILE_EVERY == 0) { /* the same mutant through the file and mmap path */
      FILE *f = fopen(mpath, "wb");
      fwrite(buf, 1, n, f);
      fclose(f);
      kg_status fs = kg_safetensors_load(&m, mpath);
      CHECK((fs == KG_OK) == (s == KG_OK), "file and memory parsers disagree on mutant %d: %s", it, kg_last_error());
      if (fs == KG_OK) sink += touch(&m);
      kg_tensor_dict_free(&m);
    }
  }
  CHECK(bad_messages == 0, "%d rejections without the 'load: fuzz: ' prefix", bad_messages);
  CHECK(rejected > N / 2, "only %d of %d mutants rejected: the mutations are too gentle", rejected, N);
  CHECK(accepted > 0, "no mutant accepted: the mutations never keep a file valid");
  printf("test_safetensors: %d mutants, %d accepted, %d rejected (sink %u); %d checks, %d failures\n", N, accepted,
         rejected, sink, checks, failures);
  free(buf);
  free(seed);
  unlink(path);
  unlink(mpath);
  rmdir(dir);
  return failures ? 1 : 0;
}
