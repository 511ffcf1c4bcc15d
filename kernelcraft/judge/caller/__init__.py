"""The caller's side of the judge: the static screen, and starting, reusing and watching judge processes (`runner`,
`zygote`, `warm`, `sandbox`, `gpushare`, `single`). Nothing here runs candidate code or touches CUDA."""
