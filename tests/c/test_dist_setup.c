/* test_dist_setup.c — keng.distributed's setup (engine/dist/dist.c): a collective may make a
 * missing NCCL communicator except while its stream is being captured into a CUDA graph, where
 * the error says to call setup first (the rule nccl.cu applies, checked here without a GPU); and
 * kg_dist_setup before and after init, on cpu, meta and (in a build without NCCL) cuda. */
#include "dist/dist.h"

#include <stdio.h>
#include <string.h>

#include "check.h"
#define HAS(s) (strstr(kg_last_error(), s) != NULL)

int main(void) {
  /* a communicator that exists, or a stream not being captured: go ahead */
  CHECK(kg_dist_comm_rule("all_reduce", 0, true, false) == KG_OK);
  CHECK(kg_dist_comm_rule("all_reduce", 0, true, true) == KG_OK);
  CHECK(kg_dist_comm_rule("all_reduce", 0, false, false) == KG_OK);
  /* none yet, inside a capture: refused, naming the op, the device and the call that fixes it */
  CHECK(kg_dist_comm_rule("broadcast", 1, false, true) != KG_OK);
  CHECK(HAS("broadcast: cuda:1 has no NCCL communicator yet"));
  CHECK(HAS("while a CUDA graph is being captured"));
  CHECK(HAS("call keng.distributed.setup(\"cuda:1\") before capturing"));

  kg_device cpu = {KG_DEV_CPU, 0}, meta = {KG_DEV_META, 0}, cuda = {KG_DEV_CUDA, 0};
  CHECK(kg_dist_setup(cpu) != KG_OK && HAS("setup: call keng.distributed.init() first"));
  CHECK(kg_dist_init() == KG_OK);
  CHECK(kg_dist_setup(cpu) == KG_OK);
  CHECK(kg_dist_setup(meta) == KG_OK);
  if (!kg_nccl_available()) {
    CHECK(kg_dist_setup(cuda) != KG_OK);
    CHECK(HAS("setup: cuda tensors need NCCL, and this keng was built without it"));
  }
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  else printf("test_dist_setup: ok\n");
  return failures != 0;
}
