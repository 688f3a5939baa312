/* test_dist_watchdog.c — the timeout of stream collectives (engine/dist/watchdog.c, what NCCL's
 * collectives are watched by) fed fake collectives and a fake clock: finished ones are retired,
 * one past the timeout or failed is aborted and reported once with the reason, the others stay;
 * the thread expires a collective that never finishes. */
#include "dist/dist.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"

static double fake_now;
static double fake_clock(void) { return fake_now; }

static char last_msg[512];
static int fatal_calls;
static void record(const char *msg) {
  snprintf(last_msg, sizeof last_msg, "%s", msg);
  fatal_calls++;
}

typedef struct {
  int state; /* what poll answers */
  int polls, aborts, releases;
} fake;

static int fake_poll(void *ctx, char *why, size_t n) {
  fake *f = ctx;
  f->polls++;
  if (f->state < 0) snprintf(why, n, "unhandled system error");
  return f->state;
}
static void fake_abort(void *ctx) { ((fake *)ctx)->aborts++; }
static void fake_release(void *ctx) { ((fake *)ctx)->releases++; }

static kg_watch_entry entry(const char *op, int device, fake *f) {
  kg_watch_entry e;
  memset(&e, 0, sizeof e);
  e.op = op, e.device = device, e.poll = fake_poll, e.abort = fake_abort, e.release = fake_release, e.ctx = f;
  return e;
}

static void table(void) {
  fake_now = 100, fatal_calls = 0;
  kg_watch *w = kg_watch_new(5, fake_clock, record);
  fake a = {0}, b = {0}, c = {0};
  kg_watch_entry ea = entry("all_reduce", 0, &a), eb = entry("broadcast", 1, &b), ec = entry("all_gather", 0, &c);
  CHECK(kg_watch_add(w, &ea) == KG_OK);
  fake_now = 102;
  CHECK(kg_watch_add(w, &eb) == KG_OK);
  CHECK(kg_watch_add(w, &ec) == KG_OK);
  CHECK(kg_watch_pending(w) == 3);
  /* nothing finished, nothing late */
  fake_now = 104;
  CHECK(kg_watch_poll(w) == 0 && kg_watch_pending(w) == 3 && fatal_calls == 0);
  /* c finishes: retired (released, never aborted) */
  c.state = 1;
  CHECK(kg_watch_poll(w) == 0 && kg_watch_pending(w) == 2 && c.releases == 1 && c.aborts == 0);
  /* at 105 a has waited exactly the timeout: still kept */
  fake_now = 105;
  CHECK(kg_watch_poll(w) == 0 && kg_watch_pending(w) == 2);
  /* at 106 a is late, b (started at 102) is not */
  fake_now = 106;
  CHECK(kg_watch_poll(w) == 1);
  CHECK(a.aborts == 1 && a.releases == 1 && b.aborts == 0 && b.releases == 0);
  CHECK(fatal_calls == 1);
  CHECK(strstr(last_msg, "rank 0: NCCL all_reduce on cuda:0 did not finish within 5 s (KENG_DIST_TIMEOUT); "
                         "communicator aborted") != NULL);
  CHECK(kg_watch_pending(w) == 1);
  /* b fails: expired at once with NCCL's reason, whatever the clock */
  b.state = -1;
  CHECK(kg_watch_poll(w) == 1 && b.aborts == 1 && b.releases == 1 && fatal_calls == 2);
  CHECK(strstr(last_msg, "rank 0: NCCL broadcast on cuda:1 failed: unhandled system error") != NULL);
  CHECK(kg_watch_pending(w) == 0);
  /* freeing releases what is left, aborting nothing */
  fake d = {0};
  kg_watch_entry ed = entry("reduce_scatter", 2, &d);
  CHECK(kg_watch_add(w, &ed) == KG_OK);
  kg_watch_free(w);
  CHECK(d.releases == 1 && d.aborts == 0);
}

/* many in flight: the table grows, order and contents kept */
static void growth(void) {
  fake_now = 0, fatal_calls = 0;
  kg_watch *w = kg_watch_new(1, fake_clock, record);
  static fake f[300];
  for (int i = 0; i < 300; i++) {
    memset(&f[i], 0, sizeof f[i]);
    f[i].state = i % 2;
    kg_watch_entry e = entry("all_reduce", 0, &f[i]);
    CHECK(kg_watch_add(w, &e) == KG_OK);
  }
  CHECK(kg_watch_poll(w) == 0 && kg_watch_pending(w) == 150);
  for (int i = 0; i < 300; i++) CHECK(f[i].releases == i % 2);
  for (int i = 0; i < 300; i++) f[i].state = 1;
  CHECK(kg_watch_poll(w) == 0 && kg_watch_pending(w) == 0 && fatal_calls == 0);
  kg_watch_free(w);
}

/* the thread, on the real clock: a collective that never finishes is expired after the timeout */
static void thread(void) {
  fatal_calls = 0;
  kg_watch *w = kg_watch_new(0.05, NULL, record);
  fake f = {0};
  kg_watch_entry e = entry("all_reduce", 3, &f);
  CHECK(kg_watch_add(w, &e) == KG_OK);
  CHECK(kg_watch_start(w, 0.01) == KG_OK);
  for (int i = 0; i < 200 && kg_watch_pending(w) > 0; i++) nanosleep(&(struct timespec){0, 10000000}, NULL);
  CHECK(kg_watch_pending(w) == 0);
  CHECK(fatal_calls == 1 && f.aborts == 1 && f.releases == 1);
  CHECK(strstr(last_msg, "NCCL all_reduce on cuda:3 did not finish within 0.05 s") != NULL);
  kg_watch_free(w);
}

int main(void) {
  table();
  growth();
  thread();
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("test_dist_watchdog: ok\n");
  return 0;
}
