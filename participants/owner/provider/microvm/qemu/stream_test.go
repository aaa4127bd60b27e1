package qemu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// stream writes a migration stream as QEMU 7.2 does, for the tests.
type stream struct{ bytes.Buffer }

func (s *stream) u8(v byte) *stream    { s.WriteByte(v); return s }
func (s *stream) u32(v uint32) *stream { s.Write(binary.BigEndian.AppendUint32(nil, v)); return s }
func (s *stream) u64(v uint64) *stream { s.Write(binary.BigEndian.AppendUint64(nil, v)); return s }
func (s *stream) str(v string) *stream { s.u8(byte(len(v))); s.WriteString(v); return s }

// header is the file header and a configuration with x-ignore-shared.
func (s *stream) header() *stream {
	s.u32(streamMagic).u32(streamVersion)
	s.u8(secConfiguration).u32(7)
	s.WriteString("microvm")
	return s.u8(secSubsection).str("configuration/capabilities").u32(1).u32(1).str("x-ignore-shared")
}

// page is a RAM page record: flags with the block's name unless it
// continues, then the page or the zero page's fill byte.
func (s *stream) page(block string, addr uint64, cont bool, data []byte) *stream {
	flags := uint64(ramPage)
	if len(data) == 1 {
		flags = ramZero
	}
	if cont {
		flags |= ramContinue
	}
	s.u64(addr | flags)
	if !cont {
		s.str(block)
	}
	s.Write(data)
	return s
}

func fill(b byte) []byte { return bytes.Repeat([]byte{b}, PageSize) }

const (
	testBlock = 16 * PageSize
	biosBlock = 2 * PageSize
)

// blocks is the MEM_SIZE record: ram0 and pc.bios, with their addresses.
func (s *stream) blocks() *stream {
	s.u64((testBlock + biosBlock) | ramMemSize)
	s.str(GuestRAMBlock).u64(testBlock).u64(0)
	return s.str("pc.bios").u64(biosBlock).u64(0xfffe0000)
}

// devices is what follows the RAM section: a device section, the end of
// file, and the description QEMU appends (copied as they are).
var devices = []byte{secFull, 0, 0, 0, 3, 5, 'a', 'p', 'i', 'c', '0', 0, 0, 0, 0, 0, 0, 0, 1, 0xde, 0xad, secFooter, 0, 0, 0, 3, secEOF, 0x06, 0, 0, 0, 2, '{', '}'}

// The block's pages go to the RAM file at their offsets, a page sent
// again wins, a zero page stays a hole unless its page was written, and
// the other blocks' records stay in the state, named again where the
// record they continued went to the RAM file.
func TestSplitRAM(t *testing.T) {
	in := new(stream).header()
	in.u8(secStart).u32(2).str("ram").u32(0).u32(4).blocks().u64(ramEOS).u8(secFooter).u32(2)
	in.u8(secPart).u32(2)
	in.page(GuestRAMBlock, 0, false, fill(1))
	in.page(GuestRAMBlock, PageSize, true, fill(2))
	in.page(GuestRAMBlock, 2*PageSize, true, []byte{0})
	in.page("pc.bios", 0, false, fill(9))
	in.page(GuestRAMBlock, 3*PageSize, false, fill(3))
	in.page(GuestRAMBlock, 4*PageSize, true, []byte{0xab})
	in.page("pc.bios", PageSize, false, fill(8))
	in.u64(ramEOS).u8(secFooter).u32(2)
	in.u8(secEnd).u32(2)
	in.page(GuestRAMBlock, 0, false, fill(5))
	in.page(GuestRAMBlock, PageSize, true, []byte{0})
	in.u64(ramEOS).u8(secFooter).u32(2)
	in.Write(devices)

	want := new(stream).header()
	want.u8(secStart).u32(2).str("ram").u32(0).u32(4).blocks().u64(ramEOS).u8(secFooter).u32(2)
	want.u8(secPart).u32(2)
	want.page("pc.bios", 0, false, fill(9))
	want.page("pc.bios", PageSize, true, fill(8))
	want.u64(ramEOS).u8(secFooter).u32(2)
	want.u8(secEnd).u32(2).u64(ramEOS).u8(secFooter).u32(2)
	want.Write(devices)

	ram := filepath.Join(t.TempDir(), "ram")
	f, err := os.Create(ram)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(testBlock); err != nil {
		t.Fatal(err)
	}
	var state bytes.Buffer
	st, err := SplitRAM(bytes.NewReader(in.Bytes()), &state, f, GuestRAMBlock, testBlock)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(state.Bytes(), want.Bytes()) {
		t.Fatalf("state:\n%x\nwant:\n%x", state.Bytes(), want.Bytes())
	}
	if st.Pages != 6 || st.Written != 4 || st.ZeroPages != 1 || st.BlockBytes != testBlock {
		t.Fatalf("stats %+v: want 6 pages (one sent twice, one zero page over a written one, one filled) of 4 distinct, 1 zero page left a hole, %d bytes", st, testBlock)
	}
	got, err := os.ReadFile(ram)
	if err != nil {
		t.Fatal(err)
	}
	wantRAM := slicesConcat(fill(5), fill(0), fill(0), fill(3), fill(0xab), make([]byte, testBlock-5*PageSize))
	for i := 0; i < testBlock; i += PageSize {
		if !bytes.Equal(got[i:i+PageSize], wantRAM[i:i+PageSize]) {
			t.Errorf("RAM page %d starts %x, want %x", i/PageSize, got[i:i+4], wantRAM[i:i+4])
		}
	}
	// The state split again has nothing of the block left.
	var again bytes.Buffer
	st, err = SplitRAM(bytes.NewReader(state.Bytes()), &again, f, GuestRAMBlock, testBlock)
	if err != nil || st.Pages != 0 || !bytes.Equal(again.Bytes(), state.Bytes()) {
		t.Fatalf("the split state split again: %+v %v, same bytes %v", st, err, bytes.Equal(again.Bytes(), state.Bytes()))
	}
}

func slicesConcat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// A stream it cannot read is an error naming what it found, never a
// guess.
func TestSplitRAMRefuses(t *testing.T) {
	good := func() *stream {
		s := new(stream).header()
		return s.u8(secStart).u32(2).str("ram").u32(0).u32(4).blocks().u64(ramEOS).u8(secFooter).u32(2).u8(secPart).u32(2)
	}
	for _, c := range []struct {
		name string
		in   []byte
		want string
	}{
		{"bad magic", new(stream).u32(0x1234).u32(3).Bytes(), "magic"},
		{"another version", new(stream).u32(streamMagic).u32(2).Bytes(), "version 2"},
		{"XBZRLE page", good().u64(ramXBZRLE).Bytes(), "XBZRLE"},
		{"compressed page", good().u64(ramCompress).Bytes(), "compressed"},
		{"page past the block", good().page(GuestRAMBlock, testBlock, false, fill(1)).Bytes(), "past the end"},
		{"page at the top of the address space", good().page(GuestRAMBlock, 0x7ffffffffffff000, false, fill(1)).Bytes(), "past the end"},
		{"zero page at the top of the address space", good().page(GuestRAMBlock, 0xfffffffffffff000, false, []byte{0}).Bytes(), "past the end"},
		{"cut mid-page", good().page(GuestRAMBlock, 0, false, fill(1)).Bytes()[:good().Len()+20], "unexpected EOF"},
		{"continue of nothing", good().page(GuestRAMBlock, 0, true, fill(1)).Bytes(), "continues no block"},
		{"another iterative section", new(stream).header().u8(secStart).u32(3).str("block").u32(0).u32(1).Bytes(), `"block"`},
		{"a block of another size", func() []byte {
			s := new(stream).header()
			s.u8(secStart).u32(2).str("ram").u32(0).u32(4)
			s.u64(2*testBlock | ramMemSize).str(GuestRAMBlock).u64(2 * testBlock).u64(0)
			return s.Bytes()
		}(), "not the guest's"},
		{"no such block", func() []byte {
			s := new(stream).header()
			s.u8(secStart).u32(2).str("ram").u32(0).u32(4)
			s.u64(biosBlock | ramMemSize).str("pc.bios").u64(biosBlock).u64(0).u64(ramEOS).u8(secFooter).u32(2)
			return append(s.Bytes(), devices...)
		}(), `no RAM block "ram0"`},
		{"a section without its footer", good().u64(ramEOS).u8(secFooter).u32(9).Bytes(), "not its footer"},
		{"unknown section type", new(stream).header().u8(0x42).Bytes(), "section type 0x42"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := os.Create(filepath.Join(t.TempDir(), "ram"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			_, err = SplitRAM(bytes.NewReader(c.in), new(bytes.Buffer), f, GuestRAMBlock, testBlock)
			if !errors.Is(err, ErrStream) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v: want ErrStream naming %q", err, c.want)
			}
		})
	}
}

// A write that fails is the disk's fault, said as such, not the stream's.
func TestSplitRAMWriteFailure(t *testing.T) {
	s := new(stream).header()
	s.u8(secStart).u32(2).str("ram").u32(0).u32(4).blocks().u64(ramEOS).u8(secFooter).u32(2)
	s.u8(secPart).u32(2).page(GuestRAMBlock, 0, false, fill(1)).u64(ramEOS).u8(secFooter).u32(2)
	s.Write(devices)
	full := errors.New("no space left on device")
	_, err := SplitRAM(bytes.NewReader(s.Bytes()), new(bytes.Buffer), failingRAM{full}, GuestRAMBlock, testBlock)
	if !errors.Is(err, full) || errors.Is(err, ErrStream) || !strings.Contains(err.Error(), "writing the RAM file") {
		t.Fatalf("err %v: want the RAM file's write error, not ErrStream", err)
	}
}

type failingRAM struct{ err error }

func (f failingRAM) WriteAt([]byte, int64) (int, error) { return 0, f.err }

// FuzzSplitRAM: no stream makes it panic or write outside the block, and
// what it accepts splits again to the same state with no page left.
func FuzzSplitRAM(f *testing.F) {
	s := new(stream).header()
	s.u8(secStart).u32(2).str("ram").u32(0).u32(4).blocks().u64(ramEOS).u8(secFooter).u32(2)
	s.u8(secPart).u32(2).page(GuestRAMBlock, 0, false, fill(1)).page("pc.bios", 0, false, fill(2)).page("pc.bios", PageSize, true, []byte{0})
	s.u64(ramEOS).u8(secFooter).u32(2)
	s.Write(devices)
	f.Add(s.Bytes())
	high := new(stream).header()
	high.u8(secStart).u32(2).str("ram").u32(0).u32(4).blocks().u64(ramEOS).u8(secFooter).u32(2)
	high.u8(secPart).u32(2).page(GuestRAMBlock, 0x7ffffffffffff000, false, []byte{0})
	f.Add(high.Bytes())
	f.Fuzz(func(t *testing.T, in []byte) {
		ram := &boundedRAM{}
		var state bytes.Buffer
		st, err := SplitRAM(bytes.NewReader(in), &state, ram, GuestRAMBlock, testBlock)
		if ram.end > st.BlockBytes {
			t.Fatalf("wrote up to byte %d of a block of %d", ram.end, st.BlockBytes)
		}
		if err != nil {
			if !errors.Is(err, ErrStream) {
				t.Fatalf("error %v is not ErrStream", err)
			}
			return
		}
		var again bytes.Buffer
		st, err = SplitRAM(bytes.NewReader(state.Bytes()), &again, ram, GuestRAMBlock, testBlock)
		if err != nil || st.Pages != 0 || !bytes.Equal(again.Bytes(), state.Bytes()) {
			t.Fatalf("split again: %+v %v", st, err)
		}
	})
}

// boundedRAM is a RAM file that keeps only how far it was written.
type boundedRAM struct{ end int64 }

func (r *boundedRAM) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 {
		panic("a write before the block")
	}
	r.end = max(r.end, off+int64(len(p)))
	return len(p), nil
}
