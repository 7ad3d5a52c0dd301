# The CUDA emulation: turns one .cu file into host C++ (cmake -P, IN and OUT
# set). Two rewrites, nothing else changes and line numbers stay:
#   name<<<grid, block, smem, stream>>>(args)
#     -> ig_emu::launch("name", name)(grid, block, smem, stream)(args)
#   extern __shared__ T name[];  ->  T *name = (T *)ig_emu::dynamic_smem();
file(READ "${IN}" src)
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_]*(<[^<>;]*>)?)<<<" "ig_emu::launch(\"\\1\", \\1)(" src "${src}")
string(REPLACE ">>>" ")" src "${src}")
string(REGEX REPLACE "extern __shared__ ([A-Za-z_][A-Za-z0-9_ ]*[A-Za-z0-9_]) ([A-Za-z_][A-Za-z0-9_]*)\\[\\];"
       "\\1 *\\2 = (\\1 *)ig_emu::dynamic_smem();" src "${src}")
file(WRITE "${OUT}.tmp" "#line 1 \"${IN}\"\n${src}")
file(RENAME "${OUT}.tmp" "${OUT}")
