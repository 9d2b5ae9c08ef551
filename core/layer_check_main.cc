// The main() of the layer check programs (Note [layers the build enforces] in meson.build): they
// exist to be linked, not run; linking one proves its layer needs nothing from the layers above.
int main() { return 0; }
