// Package sweimage builds the container images of the bundled SWE-style
// task set here, from Debian's packages, with no registry: a base root
// file system made by debootstrap (Debian bookworm, minbase, with python3,
// pytest, git and CA certificates) once into a cache directory, turned
// once into a cached gzip layer, and for each instance an image of that
// layer and a small one holding its repository at /testbed (WorkingDir
// /testbed), written into one OCI image layout with one manifest per
// instance, named by the annotation org.opencontainers.image.ref.name.
// "<layout dir>:<name>" is then the image's reference (package image).
//
// The cache (DefaultCache unless told) is shared by every builder on the
// host: an flock on its lock file makes the first one build and the rest
// wait; what is there is reused. Base builds the root file system and its
// layer, and Write writes images over it.
package sweimage
