/* version.h - dgemma's version, and the protocol and schema versions it speaks. */
#ifndef DG_VERSION_H
#define DG_VERSION_H

#define DGEMMA_VERSION "0.1.0"

#endif
