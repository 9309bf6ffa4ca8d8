/* emu_errors.c — bad input on the emulated device gets the CPU's error (suite "errors"): each
 * call runs on CPU tensors and on their device copies; both must fail, with the same message.
 * Then the emulator's own checks (emu_probe.cu): mma.sync against a plain product, and each rule
 * a GPU enforces must be reported when a kernel breaks it. */
#include "emu_check.h"
long emu_expect(void (*f)(void)); /* emulator errors f caused (then forgiven) */
int emu_probe_mma(int f16);
int emu_probe_poison(void);
void emu_probe_mma_exit(void), emu_probe_smem_over(void), emu_probe_static_over(void), emu_probe_smem_optin(void),
    emu_probe_misaligned_float4(void), emu_probe_misaligned_u32(void), emu_probe_misaligned_vec(void),
    emu_probe_aligned(void);
/* f must cause emulator reports (want 1) or none (want 0) */
static void expect(const char *what, void (*f)(void), int want) {
  long n = emu_expect(f);
  if ((n > 0) != want)
    emu_fails++, printf("FAIL errors %s: %ld emulator reports, want %s\n", what, n, want ? "some" : "none");
  else
    emu_passes++;
}
static void probes(void) {
  for (int f16 = 0; f16 < 2; f16++) {
    int bad = emu_probe_mma(f16);
    if (bad)
      emu_fails++,
          printf("FAIL errors mma.sync %s: %d of 512 elements differ from the product\n", f16 ? "f16" : "bf16", bad);
    else
      emu_passes++;
  }
  int bad = emu_probe_poison();
  if (bad)
    emu_fails++, printf("FAIL errors shared memory poison: %d reads saw another block's values\n", bad);
  else
    emu_passes++;
  expect("mma.sync with a lane exited", emu_probe_mma_exit, 1);
  expect("64 KB dynamic shared memory without opt-in", emu_probe_smem_over, 1);
  expect("64 KB dynamic shared memory opted in", emu_probe_smem_optin, 0);
  expect("32 KB static + 32 KB dynamic shared memory", emu_probe_static_over, 1);
  expect("misaligned float4 load", emu_probe_misaligned_float4, 1);
  expect("misaligned u32 load of two 16-bit elements", emu_probe_misaligned_u32, 1);
  expect("misaligned lt_dev_vec load", emu_probe_misaligned_vec, 1);
  expect("aligned vector loads", emu_probe_aligned, 0);
}
static char cpu_msg[512];
static void both(const char *what, int rc, int rd) {
  if (rc == 0 || rd == 0) {
    emu_fails++;
    printf("FAIL errors %s: cpu rc %d device rc %d\n", what, rc, rd);
  } else if (strcmp(cpu_msg, lt_last_error()) != 0) {
    emu_fails++;
    printf("FAIL errors %s: messages differ:\n  cpu:    %s\n  device: %s\n", what, cpu_msg, lt_last_error());
  } else {
    emu_passes++;
  }
}
#define SAVE(rc) (rc_tmp = (rc), snprintf(cpu_msg, sizeof cpu_msg, "%s", lt_last_error()), rc_tmp)
void emu_suite_errors(void) {
  int rc_tmp;
  int64_t s23[2] = {2, 3}, s3[1] = {3}, s4[1] = {4}, q[4] = {1, 3, 3, 4}, k[4] = {1, 3, 2, 4}, odd[4] = {1, 2, 2, 3};
  lt_tensor *a = emu_rnd(2, s23, LT_F32, -1, 1, 0), *b = emu_rnd(1, s4, LT_F32, -1, 1, 0);
  lt_tensor *ad = emu_dev(a, 0), *bd = emu_dev(b, 0);
  lt_tensor *o = lt_tensor_new(), *od = lt_tensor_new(), *o2 = lt_tensor_new(), *o2d = lt_tensor_new();
  both("binary shapes", SAVE(lt_binary(o, a, b, LT_ADD)), lt_binary(od, ad, bd, LT_ADD));
  lt_tensor *t = emu_rnd(1, s3, LT_I64, 0, 3, 1);
  lt_set_at(t, (int64_t[]){2}, 5);
  lt_tensor *td = emu_dev(t, 0);
  both("cross_entropy target", SAVE(lt_cross_entropy_forward(o, o2, a, t, -100)),
       lt_cross_entropy_forward(od, o2d, ad, td, -100));
  lt_tensor *t2 = emu_rnd(1, s3, LT_I64, 0, 2, 1), *t2d;
  lt_set_at(t2, (int64_t[]){1}, -1);
  t2d = emu_dev(t2, 0);
  both("embedding id", SAVE(lt_embedding_forward(o, a, t2)), lt_embedding_forward(od, ad, t2d));
  lt_tensor *x = emu_rnd(4, odd, LT_F32, -1, 1, 0), *xd = emu_dev(x, 0);
  both("rope odd D", SAVE(lt_rope(o, x, NULL, 10000, 0)), lt_rope(od, xd, NULL, 10000, 0));
  lt_tensor *qq = emu_rnd(4, q, LT_F32, -1, 1, 0), *kk = emu_rnd(4, k, LT_F32, -1, 1, 0);
  lt_tensor *qqd = emu_dev(qq, 0), *kkd = emu_dev(kk, 0);
  both("attention GQA", SAVE(lt_attention_forward(o, o2, qq, kk, kk, NULL, 0.5, 0, 0)),
       lt_attention_forward(od, o2d, qqd, kkd, kkd, NULL, 0.5, 0, 0));
  lt_tensor *w = emu_rnd(1, s4, LT_F32, -1, 1, 0), *wd = emu_dev(w, 0);
  both("layer_norm weight", SAVE(lt_layer_norm_forward(o, NULL, NULL, a, w, NULL, 1e-5)),
       lt_layer_norm_forward(od, NULL, NULL, ad, wd, NULL, 1e-5));
  lt_tensor *m = emu_rnd(2, s23, LT_F32, 0, 1, 0), *md = emu_dev(m, 0);
  both("adamw shapes", SAVE(lt_adamw_step(a, b, m, m, 1e-3, 0.9, 0.99, 1e-8, 0, 1)),
       lt_adamw_step(ad, bd, md, md, 1e-3, 0.9, 0.99, 1e-8, 0, 1));
  both("softmax dim", SAVE(lt_softmax(o, a, 5)), lt_softmax(od, ad, 5));
  lt_tensor *all[] = {a, b, ad, bd, o, od, o2, o2d, t, td, t2, t2d, x, xd, qq, kk, qqd, kkd, w, wd, m, md};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) lt_release(all[i]);
  probes();
}
