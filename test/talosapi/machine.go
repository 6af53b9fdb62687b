package talosapi

import (
	"context"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/protobuf/types/known/emptypb"
)

// machineService answers the two MachineService methods tests need: Version, a
// reader method, and Reboot, an operator method that proves what a reader
// credential cannot do. Every other method is Unimplemented (after the os:admin
// fallback check, as in Talos).
type machineService struct {
	machine.UnimplementedMachineServiceServer

	s *Server
}

func (m *machineService) Version(context.Context, *emptypb.Empty) (*machine.VersionResponse, error) {
	return &machine.VersionResponse{
		Messages: []*machine.Version{{
			Version: &machine.VersionInfo{Tag: m.s.version},
		}},
	}, nil
}

// Reboot records the request and does nothing: the authorization in front of it
// is what tests are about.
func (m *machineService) Reboot(context.Context, *machine.RebootRequest) (*machine.RebootResponse, error) {
	m.s.recordReboot()

	return &machine.RebootResponse{Messages: []*machine.Reboot{{}}}, nil
}
