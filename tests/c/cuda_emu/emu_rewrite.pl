#!/usr/bin/env perl
# emu_rewrite.pl — a kernel file (kernels/*.cu, *.cuh) rewritten as C++ for the emulator (emu.h),
# stdin to stdout (run.sh):
#   kernel<<<grid, block, smem, stream>>>(args);  ->  emu_launch(EMU_CFG(grid, block, smem, stream),
#                                                     "kernel", kernel, [&]{ kernel(args); });
#   extern __shared__ T name[];                    ->  T *name = (T *)emu_dyn_smem;
#   __shared__ T a[N], b;                          ->  static T a[N], b; emu_smem_static(&a, sizeof a); ...
#   *reinterpret_cast<T *>(p), reinterpret_cast<T *>(p)[i]
#                                                  ->  the same with emu_vcast (checks p's alignment: it is
#                                                      accessed here; a cast kept for later is not, as a
#                                                      kernel may form a misaligned pointer it never uses)
#   struct alignas(n) V { ... };                   ->  struct alignas(n) V { EMU_VEC_CHECKS(V) ... };
#                                                      (its copies check the alignment of both ends)
#   asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {D}, {A}, {B}, {C};" : outs : ins);
#                                                  ->  emu_mma_m16n8k16<EMU_MMA_BF16>(D..., A..., B..., C...);
# Other inline PTX becomes emu_asm_unsupported("..."), which reports it when it runs.
use strict;
use warnings;
local $/;
my $src = <STDIN>;

sub shared_decl {
  my ($type, $decls) = @_;
  my @names = map { (my $n = $_) =~ s/^\s*(\w+).*$/$1/s; $n } split /,/, $decls;
  return "static $type $decls;" . join('', map { " emu_smem_static(&$_, sizeof $_);" } @names);
}

sub asm_stmt {
  my ($body) = @_;
  my $tmpl = '';
  $tmpl .= $1 while $body =~ s/^\s*"((?:[^"\\]|\\.)*)"//s;
  my @ops; # [constraint modifier, expression] in operand order
  push @ops, [$1, $2] while $body =~ /"([=+]?)\w+"\s*\(\s*((?:[^()]|\([^()]*\))*?)\s*\)/g;
  my $regs = qr/%\d+(?:\s*,\s*%\d+)*/;
  if ($tmpl =~ /^\s*mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.(bf16|f16)\.\1\.f32\s+
                \{($regs)\}\s*,\s*\{($regs)\}\s*,\s*\{($regs)\}\s*,\s*\{($regs)\}\s*;(?:\\n)?\s*$/x) {
    my ($kind, @groups) = ($1 eq 'bf16' ? 'EMU_MMA_BF16' : 'EMU_MMA_F16', $2, $3, $4, $5);
    my @want = (4, 4, 2, 4); # D, A, B, C registers
    my @args;
    for my $g (0 .. 3) {
      my @idx = $groups[$g] =~ /%(\d+)/g;
      die "emu_rewrite: mma operand group $g has " . scalar(@idx) . " registers\n" if @idx != $want[$g];
      for my $i (@idx) {
        die "emu_rewrite: mma operand %$i does not exist\n" if $i >= @ops;
        die "emu_rewrite: mma D operand %$i is not an output\n" if $g == 0 && $ops[$i][0] eq '';
        push @args, $ops[$i][1];
      }
    }
    return "emu_mma_m16n8k16<$kind>(" . join(', ', @args) . ");";
  }
  (my $what = $tmpl) =~ s/["\\]//g;
  $what =~ s/\s+/ /g;
  return "emu_asm_unsupported(\"" . substr($what, 0, 80) . "\");";
}

$src =~ s/(\w+(?:<[^<>;]*>)?)\s*<<<(.*?)>>>\((.*?)\);/emu_launch(EMU_CFG($2), "$1", $1, [&]{ $1($3); });/gs;
$src =~ s/extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w ]+?)\s+(\w+)\[\];/$1 *$2 = ($1 *)emu_dyn_smem;/g;
$src =~ s/\b__shared__\s+((?:__align__\(\d+\)\s+)?[\w:]+(?:<[^<>;\n]*>)?)\s+([^;\n]+);/shared_decl($1, $2)/ge;
my $ptr = qr/(?:[^<>;]|<[^<>;]*>)*\*/;
$src =~ s/\*\s*reinterpret_cast\s*<($ptr)\s*>/*emu_vcast<$1>/g;
$src =~ s/\breinterpret_cast\s*<($ptr)\s*>\s*(\((?:[^()]++|(?-1))*\))(?=\s*\[)/emu_vcast<$1>$2/g;
$src =~ s/\b(struct\s+alignas\((?:[^()]|\([^()]*\))*\)\s+(\w+)\s*\{)/$1 EMU_VEC_CHECKS($2)/g;
$src =~ s/\basm\s+volatile\s*\((.*?)\);/asm_stmt($1)/gse;
print $src;
