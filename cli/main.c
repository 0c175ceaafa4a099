/* main.c - the kvx command (placeholder until cli/ lands). */
#include "kvx.h"
#include <stdio.h>
int main(void) { printf("kvx %s\n", kvx_version()); return 0; }
